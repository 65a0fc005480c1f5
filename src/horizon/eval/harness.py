"""Eval harness: N passes of a policy over a task set in sandboxes (docs/SPEC.md §7).

For every (task, pass) an `Episode` runs in its own fresh sandbox; up to `max_parallel` episodes are
driven together by `horizon.agent.run_episodes` (independently through the rollout engine's stream when
the policy has one, `policy_from_params`; else, e.g. a scripted policy, in lockstep, one batched policy
call per step), their sandboxes are opened / verified / closed from a thread pool. Per episode we record
reward, the agent's stats (STATS_KEYS), completion tokens, end-to-end latency, inference-cost estimate
and behaviour flags; `summarize` turns the records into per-task and overall tables.

Metrics (per task over its n passes, then averaged over tasks with equal weight):
- accuracy: mean reward over passes ("mean accuracy" of the report's figure 5).
- pass@k, k = 1..n ("best-of-K"): the unbiased estimator of Chen et al. 2021 (Codex),
  pass@k = 1 - C(n-c, k) / C(n, k), with c = passes whose reward >= success_threshold. It is
  the probability that at least one of k passes drawn without replacement from the n solves the
  task, i.e. an unbiased estimate of best-of-k success; pass@1 = c/n.
- completion_tokens: model-generated tokens over the whole chain (summaries included).
- latency_s: wall time from the start of the batch until the episode was seen done
  (generation + tool calls, at the granularity of one lockstep step or one engine round-trip; excludes sandbox start
  and verification, which are reported separately as sandbox_s / verify_s).
- inference FLOPs ≈ 2 · active_params · tokens (a forward costs ~2 FLOPs per active weight per
  token; attention's quadratic term is ignored). `gen_flops` uses completion tokens only;
  `flops` uses every token the model processes assuming a prefix-cached server: each token of
  each context segment once (prompt, observations and generations; a summary restarts the
  context, so the rewritten context is processed again). active_params from
  `horizon.model.params.count_params` (routed experts a token does not use are excluded).
"""

from __future__ import annotations

import dataclasses
import math
import queue
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from horizon.agent import STATS_KEYS, Episode, ScriptedPolicy, episode_step_limit, run_episodes
from horizon.env.families import make_episode as family_episode
from horizon.env.rollouts import task_image
from horizon.eval import behaviour
from horizon.inference.policy import Policy, StreamWrapper, rollout_policy
from horizon.inference.sampler import ParamsHolder
from horizon.model import hf, transformer
from horizon.sandbox.base import SandboxInfraError
from horizon.tasks import open_task_sandbox, verify
from horizon.tasks.diagnosis import diagnose
from horizon.train.checkpoint import restore_params
from horizon.utils.progress import progress
from horizon.utils.seeds import run_keys


# ------------------------------------------------------------------------------------ estimators
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c successes: 1 - C(n-c, k)/C(n, k) (Chen et al. 2021).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which avoids huge binomials.
    """
    if not (isinstance(n, (int, np.integer)) and isinstance(c, (int, np.integer)) and isinstance(k, (int, np.integer))):
        raise TypeError(f"n, c, k must be ints, got {n!r}, {c!r}, {k!r}")
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need n >= 1, 0 <= c <= n, 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def inference_flops(active_params: int, tokens: int) -> float:
    """Forward-pass FLOPs ≈ 2 · active params · tokens (module docstring)."""
    return 2.0 * float(active_params) * float(tokens)


# ------------------------------------------------------------------------------------ policies
def policy_from_params(params: dict, cfg, key, **sampler_overrides) -> Policy:
    """Sampling policy over an in-memory param tree: the rollout engine
    (`horizon.inference.policy.rollout_policy`; sharded over `cfg`'s mesh if it has several devices)."""
    return rollout_policy(ParamsHolder(params), cfg, key, **sampler_overrides)


def load_params(ckpt_dir: str, cfg, key=None) -> tuple[dict, dict]:
    """(params, meta) from the newest checkpoint in `ckpt_dir` (`train.checkpoint.restore_params`:
    any `Checkpointer` dir whose `state` holds params). `""` = the run's starting params from `key`
    (default: the RL drivers' init key of `cfg.seed`): `model.init_from`'s HF checkpoint if set, else
    the untrained init; meta {"step": 0}."""
    if not ckpt_dir:
        key = run_keys(cfg.seed)["init"] if key is None else key
        if str(cfg.model.get("init_from", "") or ""):
            return hf.pretrained_params(cfg, key), {"step": 0, "source": str(cfg.model.init_from)}
        return transformer.init(key, cfg.model), {"step": 0, "source": "init"}
    return restore_params(ckpt_dir, cfg.model)


def scripted_policy(tasks, tokenizer) -> Policy:
    """The tasks' scripted solutions as a policy (harness tests; upper-bound row)."""
    return ScriptedPolicy.from_tasks(tasks, tokenizer)


# ------------------------------------------------------------------------------------ running
@dataclasses.dataclass
class EvalSetup:
    """What the harness needs besides the policy. `registry_fn(task)` gives the task's tool set;
    `open_fn(task)` opens its sandbox (default: `open_task_sandbox(task, backend)`) and
    `release_fn(sandbox)` gives it back (default: close it) — hooks that let an environment lend
    its pooled sandboxes (`pooled_setup`, the RL loop's periodic eval); `episode_fn(task, sandbox)`, if set,
    builds the episode instead of `make_episode`;
    `check_edits`: the verifier's eager-edit check and the `eager_edit` behaviour flag;
    `infra_retries`: times an episode whose sandbox failed (end reason "infra" or a verifier
    `infra_error`) is run again on a fresh sandbox before the eval stops with an error — an
    infrastructure failure is never scored as the policy's (docs/SPEC.md §4.1 "infrastructure is not
    the policy")."""

    agent_cfg: Any
    tokenizer: Any
    registry_fn: Callable | None
    num_passes: int
    max_parallel: int = 8
    backend: str = "docker"
    verify_timeout_s: float = 60.0
    success_threshold: float = 1.0
    active_params: int = 0
    open_fn: Callable | None = None
    system_prompt: str | None = None     # replaces the agent's system message (e.g. synthetic.SYSTEM_PROMPT)
    release_fn: Callable | None = None
    episode_fn: Callable | None = None
    check_edits: bool = True
    infra_retries: int = 2


def pooled_setup(env, tok, passes: int) -> EvalSetup:
    """An `EvalSetup` that runs the harness in the pooled sandboxes of `env` (an `ExperimentEnv`):
    `open_fn` lends a free sandbox reset for the task, `release_fn` takes it back; episodes and
    verification are the family's (the RL loop's periodic eval, `loop.heldout_evaluator`)."""
    c, fam, pool = env.cfg, env.family, env.pool
    free: queue.SimpleQueue = queue.SimpleQueue()
    lent: dict[int, int] = {}       # id(box) -> its pool index
    for i in range(len(pool.boxes)):
        free.put(i)

    def lend(task):
        i = free.get_nowait()       # the harness never opens more than max_parallel = the pool's size
        sb = pool.ready(i, fam.reset_step(task), task_image(fam, task), task=task)
        lent[id(sb)] = i
        return sb

    def give_back(sb):
        free.put(lent.pop(id(sb)))

    return EvalSetup(agent_cfg=c.agent, tokenizer=tok, registry_fn=None, num_passes=int(passes),
                     max_parallel=len(pool.boxes), backend=str(c.exp.backend),
                     verify_timeout_s=float(c.exp.verify_timeout_s), open_fn=lend, release_fn=give_back,
                     episode_fn=lambda t, sb: family_episode(fam, t, sb, tok, c.agent), check_edits=fam.check_edits)


def make_episode(task, sandbox, setup: EvalSetup) -> Episode:
    """The agent episode the harness runs (with `setup.system_prompt` as the system message if set)."""
    if setup.episode_fn is not None:
        return setup.episode_fn(task, sandbox)
    return Episode(task, sandbox, setup.registry_fn(task), setup.tokenizer, setup.agent_cfg,
                   system_text=setup.system_prompt or "")


class _DoneClock:
    """Wraps a policy: at each call, stamps episodes that have finished since the last call, and
    sums the seconds spent generating (`gen_s`). A policy with ``stream()`` (the rollout engine) keeps
    its independent schedule in `run_episodes`: the clock wraps the stream and stamps at each of its
    round-trips (`_ClockStream`)."""

    def __init__(self, policy: Policy, episodes: Sequence[Episode]):
        self.policy, self.episodes = policy, episodes
        self.t0 = time.perf_counter()
        self.done_at: dict[int, float] = {}
        self.gen_s = 0.0
        if callable(getattr(policy, "stream", None)):
            self.stream = lambda: _ClockStream(self, policy.stream())

    def stamp(self) -> None:
        now = time.perf_counter() - self.t0
        for i, e in enumerate(self.episodes):
            if e.done and i not in self.done_at:
                self.done_at[i] = now

    def __call__(self, contexts, max_new_tokens):
        self.stamp()
        t = time.perf_counter()
        out = self.policy(contexts, max_new_tokens)
        self.gen_s += time.perf_counter() - t
        return out


class _ClockStream(StreamWrapper):
    """An engine stream (`horizon.inference.policy.EngineStream`) whose round-trips stamp `clock`."""

    def __init__(self, clock: _DoneClock, stream):
        super().__init__(stream)
        self.clock = clock

    def advance(self) -> list:
        self.clock.stamp()
        t = time.perf_counter()
        out = self.inner.advance()
        self.clock.gen_s += time.perf_counter() - t
        return out


def _open(setup: EvalSetup, task):
    if setup.open_fn is not None:
        return setup.open_fn(task)
    return open_task_sandbox(task, backend=setup.backend)


def _finish_one(setup: EvalSetup, task, sb, traj) -> dict:
    if traj.infra:
        return dict(infra=traj.failure)
    t = time.perf_counter()
    v = verify(task, sb, traj.final_answer, timeout=setup.verify_timeout_s, check_edits=setup.check_edits)
    verify_s = time.perf_counter() - t
    if v.infra:
        return dict(infra=v.infra_error)
    try:
        diag = diagnose(task, sb, v, traj.end_reason)     # SWE-bench tasks: where it went wrong
    except SandboxInfraError as e:
        return dict(infra=str(e) or type(e).__name__)
    edited = behaviour.eager_edit(task, sb) if setup.check_edits and not task.should_edit else None
    return dict(reward=float(v.reward), tests_passed=int(v.passed), tests_total=int(v.total), verify_s=verify_s,
                edited_files=edited, **diag)


def run_eval(policy: Policy, tasks: Sequence, setup: EvalSetup, *, policy_name: str = "policy",
             log: Callable[[str], None] | None = None) -> list[dict]:
    """Run `setup.num_passes` episodes of every task; one record (dict) per episode."""
    if setup.num_passes < 1:
        raise ValueError(f"num_passes must be >= 1, got {setup.num_passes}")
    if setup.max_parallel < 1:
        raise ValueError(f"max_parallel must be >= 1, got {setup.max_parallel}")
    if not tasks:
        raise ValueError("run_eval needs at least one task")
    jobs = [(t, p) for p in range(setup.num_passes) for t in tasks]
    tries: dict[tuple[int, int], int] = {}     # (job's task index, pass) -> infrastructure failures
    cfg = setup.agent_cfg
    max_steps = episode_step_limit(cfg)
    records: list[dict] = []
    pool = ThreadPoolExecutor(max(1, min(setup.max_parallel, 16)))
    bar = progress(total=len(jobs), desc=f"eval {policy_name}", unit="episode", leave=False)
    try:
        lo = 0
        while lo < len(jobs):          # `jobs` grows when an episode is retried after an infra failure
            chunk = jobs[lo:lo + setup.max_parallel]
            lo += len(chunk)
            t = time.perf_counter()
            futs = [pool.submit(_open, setup, task) for task, _ in chunk]
            boxes = []
            err = None
            for f in futs:
                try:
                    boxes.append(f.result())
                except Exception as e:  # noqa: BLE001 - close the ones that opened, then re-raise
                    err = err or e
            try:
                if err is not None:
                    raise err
                sandbox_s = time.perf_counter() - t
                eps = [make_episode(task, sb, setup) for (task, _), sb in zip(chunk, boxes)]
                clock = _DoneClock(policy, eps)
                trajs = run_episodes(clock, eps, max_steps=max_steps, num_tool_workers=int(cfg.num_tool_workers))
                clock.stamp()
                finished = list(pool.map(lambda a: _finish_one(setup, *a), zip([c[0] for c in chunk], boxes, trajs)))
            finally:
                list(pool.map(setup.release_fn or (lambda sb: sb.close()), boxes))
            for i, ((task, p), tr, fin) in enumerate(zip(chunk, trajs, finished)):
                if "infra" in fin:     # not the policy's: run this episode again on a fresh sandbox
                    key = (id(task), p)
                    tries[key] = tries.get(key, 0) + 1
                    if tries[key] > setup.infra_retries:
                        raise RuntimeError(f"eval episode {task.id} pass {p}: its sandbox failed {tries[key]} times "
                                           f"(eval.infra_retries={setup.infra_retries}); last: {fin['infra']}")
                    print(f"[eval] {task.id} pass {p}: sandbox failed ({fin['infra'][:120]}); retrying",
                          file=sys.stderr, flush=True)
                    jobs.append((task, p))
                    continue
                processed = int(sum(len(s.tokens) for s in tr.segments))
                rec = dict(policy=policy_name, task_id=task.id, kind=task.kind, should_edit=bool(task.should_edit),
                           pass_index=p, end_reason=tr.end_reason, completion_tokens=tr.num_generated_tokens,
                           processed_tokens=processed, latency_s=clock.done_at.get(i, float("nan")),
                           batch_gen_s=clock.gen_s, sandbox_s=sandbox_s, **fin,
                           **{k: int(tr.stats.get(k, 0)) for k in STATS_KEYS})
                rec["solved"] = rec["reward"] >= setup.success_threshold
                rec["gen_flops"] = inference_flops(setup.active_params, rec["completion_tokens"])
                rec["flops"] = inference_flops(setup.active_params, processed)
                rec["eager_edit"] = None if rec["edited_files"] is None else bool(rec["edited_files"])
                records.append(rec)
            done, solved = len(records), sum(r["solved"] for r in records)
            bar.total = len(jobs)                # retried episodes join the end of the queue
            bar.set_postfix(solved=f"{solved}/{done}")
            bar.update(done - bar.n)
            if log:
                log(f"[{policy_name}] {done}/{len(jobs)} episodes, solved so far {solved}/{done} "
                    f"({time.perf_counter() - t:.1f}s this batch)")
    finally:
        bar.close()
        pool.shutdown()
    return records


# ------------------------------------------------------------------------------------ summaries
EFFICIENCY_KEYS = ("completion_tokens", "summaries", "summary_tokens", "tool_calls", "turns", "malformed_calls")


def pass_summary(records: Sequence[dict]) -> dict:
    """The RL loop's held-out numbers from `run_eval` records of one policy: mean solved rate,
    its std over passes (the eval noise), per-pass means, best-of-n over the n passes (unbiased
    pass@n, `summarize`; for 0/1 rewards the mean over tasks of the max over passes), and
    efficiency: mean per episode of EFFICIENCY_KEYS, completion tokens per solved task, summary
    tokens per summary."""
    n = 1 + max(r["pass_index"] for r in records)
    per_pass = np.asarray([np.mean([r["solved"] for r in records if r["pass_index"] == p]) for p in range(n)])
    out = dict(heldout_mean=float(per_pass.mean()), heldout_std=float(per_pass.std(ddof=1)) if n > 1 else 0.0,
               heldout_best_of_k=summarize(records, n)[1][f"best_of_{n}"], heldout_passes=per_pass.tolist())
    out.update({f"eval_{k}": float(np.mean([r[k] for r in records])) for k in EFFICIENCY_KEYS})
    solved = sum(bool(r["solved"]) for r in records)
    gen = sum(r["completion_tokens"] for r in records)
    out["eval_tokens_per_solved"] = float(gen / solved) if solved else None
    n_sum = sum(r["summaries"] for r in records)
    out["eval_tokens_per_summary"] = float(sum(r["summary_tokens"] for r in records) / n_sum) if n_sum else None
    return out


PER_TASK_MEANS = ("completion_tokens", "tool_calls", "turns", "summaries", "latency_s", "gen_flops", "flops")


def summarize(records: Sequence[dict], num_passes: int | None = None) -> tuple[list[dict], dict]:
    """(per-task rows, overall row) from `run_eval` records of ONE policy (see module docstring)."""
    if not records:
        raise ValueError("no records to summarize")
    by_task: dict[str, list[dict]] = {}
    for r in records:
        by_task.setdefault(r["task_id"], []).append(r)
    ns = {len(v) for v in by_task.values()}
    n = min(ns) if num_passes is None else int(num_passes)
    if any(len(v) < n for v in by_task.values()):
        raise ValueError(f"every task needs >= {n} passes, got counts {sorted(ns)}")
    rows = []
    for tid, rs in by_task.items():
        rs = sorted(rs, key=lambda r: r["pass_index"])[:n]
        c = sum(bool(r["solved"]) for r in rs)
        row = dict(policy=rs[0]["policy"], task_id=tid, kind=rs[0]["kind"], n=n, solved=c,
                   accuracy=float(np.mean([r["reward"] for r in rs])))
        for k in range(1, n + 1):
            row[f"best_of_{k}"] = pass_at_k(n, c, k)
        for key in PER_TASK_MEANS:
            vals = [r[key] for r in rs
                    if r.get(key) is not None and not (isinstance(r[key], float) and math.isnan(r[key]))]
            row[key] = float(np.mean(vals)) if vals else float("nan")
        rows.append(row)
    overall = dict(policy=rows[0]["policy"], tasks=len(rows), n=n, episodes=len(records),
                   accuracy=float(np.mean([r["accuracy"] for r in rows])))
    for k in range(1, n + 1):
        overall[f"best_of_{k}"] = float(np.mean([r[f"best_of_{k}"] for r in rows]))
    for key in PER_TASK_MEANS:
        overall[key] = float(np.nanmean([r[key] for r in rows]))
    overall["total_flops"] = float(sum(r["flops"] for r in records))
    overall.update(behaviour.behaviour_metrics(records))
    return rows, overall
