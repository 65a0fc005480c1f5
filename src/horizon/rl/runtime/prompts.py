"""Single-epoch prompt sampler with late hard-prompt oversampling (docs/SPEC.md §4).

docs/SPEC.md §4: "single epoch (no prompt trained twice)" and "late in training, oversample hard
prompts by simple heuristics (turns, thinking tokens)". The two are reconciled like this:

* Every prompt id is handed out at most once over the sampler's lifetime. The order is a
  seeded permutation; `state_dict()` / `from_state_dict()` round-trip the full state
  (JSON-able) so a resumed run never repeats a prompt.
* Hardness comes from rollouts recorded with `record_rollout(prompt_id, turns=...,
  thinking_tokens=...)`. A prompt that was *trained* cannot come back, so the signal used
  for *unseen* prompts is (a) the prompt's own stats if it was rolled out without being
  trained (e.g. a profiling / eval pass), else (b) the mean over its *family*
  (`families[prompt_id]`, e.g. the task kind or source repo), else (c) the global mean.
  Hardness score = `turns_weight * turns/mean_turns + thinking_weight * thinking/mean_thinking`
  (each normalised by the global mean so the two heuristics are comparable).
* Before `hard_start_step` prompts come in permutation order. From that step on, each
  remaining prompt is drawn (without replacement) with probability proportional to
  `exp(hard_weight * (score - 1))` (score 1 = average hardness), i.e. `hard_weight = 0`
  recovers uniform sampling. Draws are seeded by (seed, step) so they are reproducible
  across a checkpoint/resume.

The sampler never raises on exhaustion silently: `sample` returns fewer ids (possibly
none) once the epoch is used up, and `remaining` says how many are left.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass
class _Stats:
    n: int = 0
    turns: float = 0.0      # running sums
    thinking: float = 0.0

    def add(self, turns: float, thinking: float) -> None:
        self.n += 1
        self.turns += float(turns)
        self.thinking += float(thinking)

    def mean(self) -> tuple[float, float]:
        return (self.turns / self.n, self.thinking / self.n) if self.n else (0.0, 0.0)


class PromptSampler:
    """Hands out prompt ids for RL, each at most once (docs/SPEC.md §4 single epoch).

    Args:
      prompt_ids: the full prompt set (unique strings).
      seed: permutation / draw seed.
      families: optional prompt id -> family key used to share hardness stats.
      hard_start_step: step from which hard prompts are oversampled (<0 disables).
      hard_weight: oversampling strength (0 = uniform over remaining).
      turns_weight, thinking_weight: mix of the two hardness heuristics.
    """

    def __init__(self, prompt_ids: Sequence[str], *, seed: int, families: dict[str, str] | None = None,
                 hard_start_step: int = -1, hard_weight: float = 0.0,
                 turns_weight: float = 1.0, thinking_weight: float = 1.0):
        ids = list(prompt_ids)
        if len(set(ids)) != len(ids):
            raise ValueError("prompt_ids must be unique")
        if hard_weight < 0:
            raise ValueError(f"hard_weight must be >= 0, got {hard_weight}")
        if turns_weight < 0 or thinking_weight < 0 or turns_weight + thinking_weight <= 0:
            raise ValueError("turns_weight/thinking_weight must be >= 0 and not both 0")
        self.prompt_ids = ids
        self._id_set = set(ids)
        self.seed = int(seed)
        self.families = dict(families or {})
        self.hard_start_step = int(hard_start_step)
        self.hard_weight = float(hard_weight)
        self.turns_weight = float(turns_weight)
        self.thinking_weight = float(thinking_weight)
        self._order = [ids[i] for i in np.random.default_rng(self.seed).permutation(len(ids))]
        self._used: set[str] = set()
        self._cursor = 0
        self._prompt_stats: dict[str, _Stats] = {}
        self._family_stats: dict[str, _Stats] = {}
        self._global = _Stats()

    # ---------------------------------------------------------------- sampling
    def __contains__(self, prompt_id: str) -> bool:
        return prompt_id in self._id_set

    @property
    def remaining(self) -> int:
        return len(self.prompt_ids) - len(self._used)

    def oversampling(self, step: int) -> bool:
        return 0 <= self.hard_start_step <= step and self.hard_weight > 0

    def sample(self, n: int, step: int) -> list[str]:
        """Return up to `n` never-before-sampled prompt ids for training step `step`."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        n = min(n, self.remaining)
        if n == 0:
            return []
        out = self._sample_hard(n, step) if self.oversampling(step) else self._sample_in_order(n)
        self._used.update(out)
        return out

    def _sample_in_order(self, n: int) -> list[str]:
        out = []
        while len(out) < n:
            pid = self._order[self._cursor]
            self._cursor += 1
            if pid not in self._used:
                out.append(pid)
        return out

    def _sample_hard(self, n: int, step: int) -> list[str]:
        pool = [p for p in self._order if p not in self._used]
        scores = np.array([self.hardness(p) for p in pool], dtype=np.float64)
        logits = self.hard_weight * (scores - 1.0)
        w = np.exp(logits - logits.max())
        rng = np.random.default_rng([self.seed, int(step)])
        idx = rng.choice(len(pool), size=n, replace=False, p=w / w.sum())
        return [pool[i] for i in idx]

    # ---------------------------------------------------------------- hardness
    def record_rollout(self, prompt_id: str, *, turns: float, thinking_tokens: float) -> None:
        """Record one rollout's heuristics (from `Trajectory.stats`) for later oversampling."""
        if prompt_id not in self._id_set:
            raise KeyError(f"unknown prompt id {prompt_id!r}")
        self._prompt_stats.setdefault(prompt_id, _Stats()).add(turns, thinking_tokens)
        fam = self.families.get(prompt_id)
        if fam is not None:
            self._family_stats.setdefault(fam, _Stats()).add(turns, thinking_tokens)
        self._global.add(turns, thinking_tokens)

    def hardness(self, prompt_id: str) -> float:
        """Relative hardness (1.0 = average; see module docstring for the fallback order)."""
        if self._global.n == 0:
            return 1.0
        st = self._prompt_stats.get(prompt_id)
        if st is None:
            st = self._family_stats.get(self.families.get(prompt_id, None))
        turns, thinking = (st or self._global).mean()
        g_turns, g_thinking = self._global.mean()
        rel_t = turns / g_turns if g_turns > 0 else 1.0
        rel_k = thinking / g_thinking if g_thinking > 0 else 1.0
        tot = self.turns_weight + self.thinking_weight
        return (self.turns_weight * rel_t + self.thinking_weight * rel_k) / tot

    # ---------------------------------------------------------------- checkpointing
    def state_dict(self) -> dict:
        """JSON-able state: enough to resume without repeating a prompt (docs/SPEC.md §4)."""
        def dump(d):
            return {k: [v.n, v.turns, v.thinking] for k, v in d.items()}
        return dict(
            prompt_ids=list(self.prompt_ids), seed=self.seed, families=dict(self.families),
            hard_start_step=self.hard_start_step, hard_weight=self.hard_weight,
            turns_weight=self.turns_weight, thinking_weight=self.thinking_weight,
            used=sorted(self._used), cursor=self._cursor,
            prompt_stats=dump(self._prompt_stats), family_stats=dump(self._family_stats),
            global_stats=[self._global.n, self._global.turns, self._global.thinking])

    @classmethod
    def from_state_dict(cls, state: dict) -> PromptSampler:
        s = cls(state["prompt_ids"], seed=state["seed"], families=state["families"],
                hard_start_step=state["hard_start_step"], hard_weight=state["hard_weight"],
                turns_weight=state["turns_weight"], thinking_weight=state["thinking_weight"])
        s._used = set(state["used"])
        s._cursor = int(state["cursor"])

        def load(d):
            return {k: _Stats(int(v[0]), float(v[1]), float(v[2])) for k, v in d.items()}
        s._prompt_stats = load(state["prompt_stats"])
        s._family_stats = load(state["family_stats"])
        g = state["global_stats"]
        s._global = _Stats(int(g[0]), float(g[1]), float(g[2]))
        return s


def sampler_from_config(prompt_ids: Sequence[str], rl_cfg, *, families: dict[str, str] | None = None,
                        seed: int = 0) -> PromptSampler:
    """Build a `PromptSampler` from the `c.rl` config section (fields in configs/rl_tiny.py)."""
    return PromptSampler(prompt_ids, seed=seed, families=families,
                         hard_start_step=rl_cfg.hard_prompt_start_step,
                         hard_weight=rl_cfg.hard_prompt_weight,
                         turns_weight=rl_cfg.hard_prompt_turns_weight,
                         thinking_weight=rl_cfg.hard_prompt_thinking_weight)
