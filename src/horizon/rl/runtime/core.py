"""The three pieces every RL loop is made of (docs/SPEC.md §4, §4.1): one prompt schedule, one group
rollout, one train step on groups.

`horizon.rl.runtime.loop.run_rl` (synchronous: roll out step t with version t, then train, one process)
and `horizon.rl.runtime.orchestrator` (a trainer process and rollout-worker processes under a staleness
bound) are thin shells over these, so a run is a function of its config whichever shell runs it:
at `async_.max_staleness = 0` with `async_.publish_dtype = "float32"` the two train on identical
groups and reach identical params (tests/rl/test_one_loop.py).

- **Slots.** Step t trains on the `N = rl.prompts_per_step` groups of slots ``[t*N, (t+1)*N)``.
  `PromptSchedule.assign(t)` gives them N fresh prompts (single epoch, `prompts.PromptSampler`,
  hard-prompt oversampling fed by the rollout stats of steps ``<= t - lag - 1``, lag = the
  staleness bound: exactly the steps both loops have finished by then). A slot's seed is its index.
- **Generation batches.** A step's slots are cut into batches of `batch_slots(cfg)` consecutive
  slots (`rl.slots_per_batch`, 0 = the whole step); one batch is one batched generation
  (`rollout_groups`) whose sampling key is ``fold_in(run_keys(seed)["rollout"], first slot)``:
  the same batch gets the same samples in every loop and after every restart.
- **Infrastructure failures** (docs/SPEC.md §4.1 "infrastructure is not the policy") never reach the trainer:
  the env reruns a group whose sandbox failed (`rl.infra.group_retries`); a group still failing is replaced in
  `rollout_groups` by the group of a fresh prompt from the slot's reserve (`rl.infra.replacements` prompts per
  slot, drawn past the run's prompt set, so no prompt is trained twice and both loops replace alike). Every
  step therefore trains exactly `rl.prompts_per_step` groups; each `GroupRecord.infra` counts what it took
  (`INFRA_KEYS`, summed into the step's metrics by `train_groups`).
- **Training.** `train_groups` builds the batch of a step's groups in slot order
  (`batch.build_batch_from_config`), packs its rows over the mesh's data-parallel ranks
  (`pack_rows`, docs/SPEC.md §2 global sequence packing) and takes one `trainer.train_step` (on the run's
  mesh, `c.mesh`). `resume_rl_state` is the one start of a trainer: state on the mesh, restored
  from the run's newest checkpoint.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from horizon.env.families import family_from_config
from horizon.inference import policy as engine_policy
from horizon.parallel import mesh as pmesh
from horizon.parallel import packing
from horizon.rl.algo import batch as rlbatch
from horizon.rl.algo import losses, trainer
from horizon.rl.runtime import prompts, storage
from horizon.rl.runtime.workers import experiment_prompt_id
from horizon.train.checkpoint import Checkpointer
from horizon.utils.seeds import run_keys

Poll = Callable[[], tuple[Any, int]]


# ----------------------------------------------------------------------------- config helpers
def batch_slots(cfg) -> int:
    """Slots (groups) per batched generation: `rl.slots_per_batch`, 0 = one step's groups
    (`rl.prompts_per_step`). Computed at use, so an override of `rl.prompts_per_step` moves it."""
    n = int(cfg.rl.slots_per_batch)
    return n if n > 0 else int(cfg.rl.prompts_per_step)


def env_name(cfg) -> str:
    """The rollout environment (`horizon.rl.runtime.workers.ENVS`): `async_.env` where the config has an
    `async_` block, else "experiment" (the `exp` block's task family, as experiments/rl.py)."""
    return str(cfg.async_.env) if "async_" in cfg else "experiment"


def prompt_ids(cfg, total: int, start: int = 0) -> list[str]:
    """`total` prompts of the run's prompt sequence from index `start`: toy ids, or the experiment
    family's train seeds after the `exp.n_sft_tasks` SFT ones (ids `workers.experiment_prompt_id`).
    The RL prompt set of a run of S steps is indices [0, S * N); the slots' reserves follow it."""
    if env_name(cfg) == "toy":
        first = int(cfg.async_.prompt_start) + int(start)
        return [f"toy_{i}" for i in range(first, first + total)]

    seeds = family_from_config(cfg.exp).seeds("train", total, int(cfg.exp.n_sft_tasks) + int(start))
    return [experiment_prompt_id(str(cfg.exp.env), s) for s in seeds]


def policy_key(cfg, first_slot: int):
    """The sampling key of the generation batch starting at slot `first_slot`."""
    import jax  # noqa: PLC0415

    return jax.random.fold_in(run_keys(cfg.seed)["rollout"], int(first_slot))


def group_advantages(rs: Sequence[float], cfg) -> list[float]:
    """Dr.GRPO advantages of one group (what `build_batch` will compute), for the group store."""
    a = losses.group_advantages(np.asarray([rs], np.float32), std_normalize=bool(cfg.rl.std_normalize),
                                std_unbiased=bool(cfg.rl.std_unbiased), eps=float(cfg.rl.adv_std_eps))
    return [float(x) for x in np.asarray(a).reshape(-1)]


# ----------------------------------------------------------------------------- prompt schedule
class PromptSchedule:
    """Slot -> prompt assignment of a run of `total_steps` steps (module docstring), checkpointable.

    `lag` is the staleness bound: `assign(t)` needs the rollout stats of every step
    ``<= t - lag - 1`` fed first (`feed`), so the hard-prompt statistics a step is drawn with are
    the same whichever loop runs it."""

    def __init__(self, cfg, total_steps: int, *, lag: int):
        self.N, self.B, self.lag = int(cfg.rl.prompts_per_step), batch_slots(cfg), int(lag)
        if self.N % self.B:
            raise ValueError(f"rl.slots_per_batch={self.B} must divide rl.prompts_per_step={self.N}")
        self.cfg, self.total = cfg, int(total_steps) * self.N
        self.R = int(cfg.rl.infra.replacements)
        self.sampler = prompts.sampler_from_config(prompt_ids(cfg, self.total), cfg.rl, seed=int(cfg.seed))
        self.requests: dict[int, list[dict]] = {}       # step -> its N slot requests
        self.fed = 0                                     # steps whose rollout stats the sampler has seen

    def assign(self, step: int) -> list[dict] | None:
        """The N slot requests {slot, prompt_id, seed} of `step` (drawn once; None when the single
        epoch is exhausted). Steps are assigned in order."""
        if step in self.requests:
            return self.requests[step]
        if self.fed < step - self.lag:
            raise RuntimeError(f"step {step}: rollout stats of step {self.fed} not fed yet (lag {self.lag})")
        if self.requests and step != max(self.requests) + 1:
            raise RuntimeError(f"steps are assigned in order: {max(self.requests) + 1} before {step}")
        ids = self.sampler.sample(self.N, step)
        if len(ids) < self.N:
            return None
        base = step * self.N
        self.requests[step] = [dict(slot=base + i, prompt_id=p, seed=base + i, reserve=self.reserve(base + i))
                               for i, p in enumerate(ids)]
        return self.requests[step]

    def reserve(self, slot: int) -> list[str]:
        """The fresh prompts that replace slot `slot`'s group if its sandboxes keep failing
        (module docstring): `rl.infra.replacements` ids past the run's prompt set, fixed per slot."""
        return prompt_ids(self.cfg, self.R, start=self.total + int(slot) * self.R) if self.R else []

    def batches(self, step: int) -> list[list[dict]]:
        """`step`'s requests cut into generation batches of `batch_slots` consecutive slots."""
        reqs = self.requests[step]
        return [reqs[i:i + self.B] for i in range(0, self.N, self.B)]

    def step_of(self, slot: int) -> int:
        return int(slot) // self.N

    def feed(self, step: int, groups: Sequence[storage.GroupRecord]) -> None:
        """Record the rollout stats (turns, thinking tokens) of `step`'s groups, in slot order."""
        if step != self.fed:
            raise RuntimeError(f"rollout stats are fed in step order: {self.fed} before {step}")
        for g in sorted(groups, key=lambda g: g.slot):
            if g.prompt_id not in self.sampler:     # a reserve prompt (infra replacement): not in the epoch
                continue
            for t in g.trajectories:
                self.sampler.record_rollout(g.prompt_id, turns=t.stats["turns"],
                                            thinking_tokens=t.stats["thinking_tokens"])
        self.fed += 1

    def state_dict(self) -> dict:
        return dict(N=self.N, B=self.B, lag=self.lag, fed=self.fed, sampler=self.sampler.state_dict(),
                    requests={str(k): v for k, v in self.requests.items()})

    def load_state_dict(self, d: dict) -> PromptSchedule:
        if (int(d["N"]), int(d["B"])) != (self.N, self.B):
            raise ValueError(f"checkpoint has {d['N']} prompts per step in batches of {d['B']}, this config "
                             f"{self.N} in batches of {self.B}")
        self.fed = int(d["fed"])
        self.sampler = prompts.PromptSampler.from_state_dict(d["sampler"])
        self.requests = {int(k): v for k, v in d["requests"].items()}
        return self


# ----------------------------------------------------------------------------- rollout + train
INFRA_KEYS = ("infra_episodes", "group_retries", "replaced_groups", "sandboxes_replaced")


def _env_counters(env) -> dict:
    return dict(getattr(env, "counters", {}))


def _failed(group) -> bool:
    return any(i.get("group_failed") for i in group[2])


def rollout_groups(env, requests: Sequence[dict], poll: Poll, cfg, tok, *, worker: str = "", push=None
                   ) -> tuple[list[storage.GroupRecord], dict]:
    """One batched generation of `requests` (one generation batch) in `env` with the weights of
    `poll() -> (params, version)`, polled every `rl.sampler.chunk_tokens` decode steps (in-flight
    updates, `rl.sampler.kv_mode`), through `engine_policy.rollout_policy` (the rollout engine, on one device
    or sharded over the run's mesh). A group whose sandboxes kept failing (the env's retries spent)
    is replaced by the group of the slot's next reserve prompt (module docstring); when a slot's
    reserve is spent too, `RuntimeError` (the infrastructure, not one box, is broken). Returns
    (one `GroupRecord` per request, batch info: wall `seconds`, `gen_s` (seconds in generation calls),
    `tool_wait_s`, `slot_steps` and `engine_tokens` (`EnginePolicy.usage`), weight `switches`,
    `start_version` and the batch's `infra/*` counters). `push`: the remote backend's weight push
    (`rl.runtime.remote.push_for`)."""

    s = cfg.rl.sampler
    policy = engine_policy.rollout_policy(poll, cfg, policy_key(cfg, requests[0]["slot"]),
                                          chunk_tokens=int(s.chunk_tokens), kv_mode=str(s.kv_mode), push=push)
    start_version = int(poll()[1])
    before = _env_counters(env)
    t0 = time.time()
    results = env.rollouts(requests, policy, tok)
    used = [dict(r) for r in requests]                 # the request each result answers (after replacements)
    replaced = [0] * len(requests)
    while bad := [i for i, g in enumerate(results) if _failed(g)]:
        for i in bad:
            reserve = list(requests[i].get("reserve", ()))
            if replaced[i] >= len(reserve):
                raise RuntimeError(f"slot {requests[i]['slot']}: its group failed on infrastructure after "
                                   f"{replaced[i]} replacement prompt(s) (rl.infra.replacements) "
                                   "and the env's retries; "
                                   f"last: {results[i][2][0].get('failure', '?')}")
            used[i] = dict(requests[i], prompt_id=reserve[replaced[i]], replaces=requests[i]["prompt_id"])
            replaced[i] += 1
        print(f"[rollout] replacing {len(bad)} group(s) whose sandboxes kept failing by fresh prompts: "
              f"{[used[i]['prompt_id'] for i in bad]}", file=sys.stderr, flush=True)
        for i, g in zip(bad, env.rollouts([used[i] for i in bad], policy, tok)):
            results[i] = g
    dt = time.time() - t0
    after = _env_counters(env)
    delta = {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in INFRA_KEYS}
    delta["replaced_groups"] = int(sum(replaced))
    recs = []
    for j, (r, (trajs, rs, infos)) in enumerate(zip(used, results)):
        lo, hi = storage.group_versions(trajs)
        # batch-level counters go on the batch's first group, so a step's sum over groups is exact
        infra = dict(delta) if j == 0 else dict.fromkeys(INFRA_KEYS, 0)
        infra["replaced_groups"] = replaced[j]
        recs.append(storage.GroupRecord(
            slot=int(r["slot"]), prompt_id=r["prompt_id"], trajectories=trajs, rewards=[float(x) for x in rs],
            advantages=group_advantages(rs, cfg), min_version=lo, max_version=hi, start_version=start_version,
            generated_tokens=int(sum(t.num_generated_tokens for t in trajs)), worker=worker, seconds=dt,
            infos=infos, infra=infra))
    return recs, dict(seconds=dt, **policy.usage(), switches=int(policy.state["switches"]),
                      start_version=start_version,
                      **{f"infra/{k}": v for k, v in delta.items()})


def pack_rows(b: dict, cfg) -> tuple[dict, dict]:
    """Global sequence packing before an RL step (docs/SPEC.md §2): `b`'s rows (one segment each, docs/SPEC.md §4)
    reordered so that the contiguous split over the mesh's data-parallel ranks
    (`mesh.data_ranks`) balances the estimated cost per rank (`mesh.packing_cost_a/b`, 0/0 = the
    model's analytic attention-aware cost, `packing.model_cost_model`; method `mesh.packing`).
    Returns (batch, {"pack/imbalance", "pack/imbalance_naive", "pack/ranks"}): max/mean estimated
    cost per rank after packing and for `build_batch`'s own order."""
    m = cfg.mesh
    a, bq = float(m.packing_cost_a), float(m.packing_cost_b)
    cost = packing.model_cost_model(cfg.model) if a == 0 and bq == 0 else packing.CostModel(a, bq)
    lengths = np.asarray(b["valid"]).sum(axis=-1)
    order, st = packing.balanced_row_order(lengths, pmesh.data_ranks(cfg), cost, method=str(m.packing))
    return rlbatch.permute_rows(b, order), {f"pack/{k}": float(v) for k, v in st.items()}


def resume_rl_state(params, cfg, directory):
    """The start of every RL trainer: a fresh `RLState` of (a copy of) `params` on the run's mesh,
    restored from the newest checkpoint in `directory` if there is one (onto this mesh's shardings,
    whatever mesh wrote it). Returns (state, checkpointer, checkpoint meta or None)."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    # train_step donates its state: copy, so the caller's `params` (e.g. one SFT checkpoint shared
    # by several runs, experiments/selfsum.py) stay valid
    state = trainer.init_state(jax.tree.map(jnp.copy, params), cfg)
    ck = Checkpointer(directory, every=int(cfg.rl.checkpoint_every), keep=int(cfg.rl.max_checkpoints))
    got = ck.restore_latest(state)
    return (state, ck, None) if got is None else (got[0], ck, got[1])


def train_groups(state, groups: Sequence[storage.GroupRecord], cfg):
    """One RL step on a step's groups (slot order): `build_batch_from_config` -> `pack_rows` ->
    `trainer.train_step`. Returns (state, {metric: float} with the packing stats and the seconds spent
    building and packing the batch on the host, `time/train_host_s`; the batch)."""
    import jax  # noqa: PLC0415

    t0 = time.perf_counter()
    groups = sorted(groups, key=lambda g: g.slot)
    b = rlbatch.build_batch_from_config([g.trajectories for g in groups],
                                        np.asarray([g.rewards for g in groups], np.float32), cfg)
    b, pack = pack_rows(b, cfg)
    host_s = time.perf_counter() - t0
    state, m = trainer.train_step(state, b, cfg=cfg)
    infra = {f"infra/{k}": float(sum(getattr(g, "infra", {}).get(k, 0) for g in groups)) for k in INFRA_KEYS}
    return state, dict({k: float(v) for k, v in jax.device_get(m).items()}, **pack, **infra,
                       **{"time/train_host_s": host_s}), b


def step_histograms(groups: Sequence[storage.GroupRecord], version: int) -> dict[str, np.ndarray]:
    """A step's RL histograms (`horizon.utils.tracking`): per-episode rewards and advantages, and
    per trained token the staleness `version - the weights version that sampled it` (all 0 in the
    synchronous loop; the async runtime's lag otherwise)."""
    return dict(rewards=np.asarray([r for g in groups for r in g.rewards], np.float64),
                advantages=np.asarray([a for g in groups for a in g.advantages], np.float64),
                staleness=token_staleness(groups, version).astype(np.float64))


def token_staleness(groups: Sequence[storage.GroupRecord], version: int) -> np.ndarray:
    """`version` minus the weights version that sampled each trained (loss-masked) token of `groups`."""
    stale = [version - np.asarray(s.policy_versions)[np.asarray(s.loss_mask, bool)]
             for g in groups for t in g.trajectories for s in t.segments]
    return np.concatenate(stale) if stale else np.zeros(0, np.int64)


def transcript(group: storage.GroupRecord, tok, index: int = 0) -> str:
    """Rollout `index` of `group` as text: each context segment decoded whole (prompt, tool calls and
    results, and the summary that opens the next segment), under a header with its reward and end."""
    t = group.trajectories[index]
    head = (f"prompt {group.prompt_id}, rollout {index} of {len(group.trajectories)}: reward "
            f"{group.rewards[index]:.3f}, advantage {group.advantages[index]:+.3f}, end {t.end_reason}, "
            f"{len(t.segments)} segment(s)")
    body = "\n\n".join(f"--- segment {i} ({len(s.tokens)} tokens)\n{tok.decode([int(x) for x in s.tokens])}"
                       for i, s in enumerate(t.segments))
    return f"{head}\n\n{body}"
