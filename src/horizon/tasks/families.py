"""Procedural task families as RL environments (SPEC §4, §5, §6).

A `Family` bundles what a driver needs to run RL on a generated task family: tasks by
seed with disjoint train/held-out ranges, the env's system prompt and tool registry
(SPEC §5 per-environment tool sets), how to reset a pooled sandbox, how to verify, and
demonstrations for the SFT warm start. Two families exist:

- ``config_edit`` (`horizon.tasks.synthetic`): one `set(value, name)` call; demos are the
  canonical call, a fraction with a wrong value (`corrupt_prob`: imperfect demonstrations
  leave RL something to fix).
- ``key_recall`` (`horizon.tasks.key_recall`): read a key, then logs until the context is
  compacted; answer the key. Demos are `DemoPolicy` chains rolled out through the real
  agent loop (`Episode`), so every segment, summary query and state block is exactly what
  the policy will see; a fraction of summaries is lossy (`corrupt_prob`).

`family_from_config(c.exp)` builds one from an experiment config (`exp.env`, `exp.task`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from horizon.tasks import key_recall, synthetic
from horizon.tasks.task import Task

FAMILIES = ("config_edit", "key_recall")


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    system_prompt: str
    make_task: Callable[[int], Task]                        # seed -> task
    seeds: Callable[[str, int, int], list[int]]             # (split, n, start) -> seeds
    registry: Callable[[bool], object]                      # strict -> ToolRegistry
    check_edits: bool = True                                # verifier's eager-edit check (answer tasks)

    def tasks(self, split: str, n: int, start: int = 0) -> list[Task]:
        return [self.make_task(s) for s in self.seeds(split, n, start)]

    def reset(self, sandbox, task: Task) -> None:
        """Put a pooled sandbox into `task`'s initial state (one exec)."""
        synthetic.reset_sandbox(sandbox, task)


def family_from_config(e) -> Family:
    """The family named by `e.env` with its task options `e.task` (an experiment config)."""
    t = e.task
    if e.env == "config_edit":
        def make(seed, _t=t):
            return synthetic.make_synthetic_task(seed, value_range=tuple(_t.value_range), name_style=str(_t.name_style))
        return Family("config_edit", synthetic.SYSTEM_PROMPT, make, synthetic.synthetic_seeds,
                      lambda strict: synthetic.synthetic_registry(strict=strict))
    if e.env == "key_recall":
        def make(seed, _t=t):
            return key_recall.make_key_recall_task(seed, n_logs=int(_t.n_logs), log_lines=int(_t.log_lines),
                                                   n_decoys=int(_t.n_decoys), key_alphabet=str(_t.key_alphabet))
        # the env's only tool reads: no edit is possible, so the eager-edit check is skipped
        return Family("key_recall", key_recall.SYSTEM_PROMPT, make, key_recall.key_recall_seeds,
                      key_recall.key_recall_registry, check_edits=False)
    raise ValueError(f"exp.env must be one of {FAMILIES}, got {e.env!r}")


# ----------------------------------------------------------------------------- demonstrations
CORRUPTIONS = ("next", "random")


def config_edit_demos(tasks, tok, rng: np.random.Generator, *, corrupt_prob: float, value_range: tuple[int, int],
                      corrupt: str = "next") -> list[tuple[np.ndarray, np.ndarray]]:
    """(tokens, loss_mask) of the canonical one-call solution per task, in the agent format.

    With probability `corrupt_prob` the demonstrated value is wrong: `corrupt="next"` writes the
    next value of `value_range` (v+1, wrapping: a systematic off-by-one of the demonstrator, so
    the copy of the prompt's digit is still what predicts the demo), `"random"` a uniformly random
    one (the copy then predicts only a fraction of demos, and a tiny model learns it much later)."""
    from horizon.agent.prompt import Message, render, task_text
    from horizon.tools.format import render_call

    if corrupt not in CORRUPTIONS:
        raise ValueError(f"corrupt must be one of {CORRUPTIONS}, got {corrupt!r}")
    lo, hi = value_range
    rows = []
    for t in tasks:
        call = dict(t.solution[0])
        args = dict(call["args"])
        if rng.random() < corrupt_prob:
            v = int(args["value"])
            args["value"] = str(v + 1 if v < hi else lo) if corrupt == "next" else str(int(rng.integers(lo, hi + 1)))
        ids = tok.encode(render_call(call["name"], args)) + [tok.END_TURN]
        r = render([Message("system", synthetic.SYSTEM_PROMPT, kind="system"), Message("user", task_text(t), kind="task"),
                    Message("assistant", tokens=np.asarray(ids, np.int32))], tok)
        rows.append((r.tokens, r.loss_mask))
    return rows


def key_recall_demos(family: Family, tasks, tok, agent_cfg, sandboxes, *, corrupt_prob: float, seed: int,
                     key_alphabet: str, map_fn=map) -> list[tuple[np.ndarray, np.ndarray]]:
    """Demonstration chains of `key_recall.DemoPolicy` through the real agent loop, one
    segment per row. `sandboxes` (any backend; commands are the env's own `cat`s) are reused
    in chunks; `map_fn` may run resets in threads."""
    from horizon.agent.rollout import run_episodes

    policy = key_recall.DemoPolicy(tok, corrupt_prob, seed, key_alphabet)
    rows = []
    n = len(sandboxes)
    for i in range(0, len(tasks), n):
        chunk = tasks[i:i + n]
        list(map_fn(family.reset, sandboxes[:len(chunk)], chunk))
        eps = [make_episode(family, t, sb, tok, agent_cfg) for t, sb in zip(chunk, sandboxes)]
        steps = 2 * (int(agent_cfg.max_turns) + int(agent_cfg.max_malformed_calls)) + 8
        for tr in run_episodes(policy, eps, max_steps=steps):
            rows += [(s.tokens, s.loss_mask) for s in tr.segments if s.loss_mask.any()]
    return rows


def make_episode(family: Family, task: Task, sandbox, tok, agent_cfg):
    """An `Episode` of `task` with the family's system prompt and tools."""
    from horizon.agent import Episode, Message

    ep = Episode(task, sandbox, family.registry(bool(agent_cfg.strict_tools)), tok, agent_cfg)
    ep.messages[0] = Message("system", family.system_prompt, kind="system")
    return ep
