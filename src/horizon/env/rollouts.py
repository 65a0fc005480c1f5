"""Episodes of a task family in pooled sandboxes: the environment side of a rollout (docs/SPEC.md §4, §5, §7).

- `SandboxPool`: sandboxes created once (in threads), made ready per episode (`Sandbox.prepare`:
  leftover processes killed, health checked; then the family's one-exec reset) and replaced when
  dead or unusable (counted in `counters`);
- `rollout_batch`: one episode per task through the agent loop (`run_episodes`: batched
  generation, tool calls in threads), then the verifier and `rewards.total_reward`. An episode
  whose sandbox failed (end reason "infra", or a verifier `infra_error`) gets no reward: its info
  says `infra` and its sandbox is replaced;
- `ExperimentEnv.rollouts` reruns a group with any infra episode on fresh sandboxes (whole group:
  its advantages compare rollouts of one policy state), at most `rl.infra.group_retries` times;
  a group still failing comes back marked (`group_failed`) for `horizon.rl.runtime.core` to
  replace with a fresh prompt's group (docs/SPEC.md §4.1 "infrastructure is not the policy");
- `ExperimentEnv`: an experiment config's family and a pool, made on first use and closed by
  its owner (the sync loop and each async rollout worker hold one); the eval harness borrows its
  pool (`horizon.eval.harness.pooled_setup`: one evaluator).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from horizon.agent import Segment, run_episodes
from horizon.env import rewards
from horizon.env.families import Family, ResetStep, check_reset, family_from_config, make_episode
from horizon.sandbox import open_sandbox
from horizon.sandbox.base import SandboxError, SandboxInfraError, meter_of
from horizon.sandbox.docker import cleanup_leaked, install_cleanup_hooks
from horizon.tasks import verify


class SandboxPool:
    """`n` sandboxes of `backend` created in parallel and reused across episodes; a box that is
    dead or unusable at its reset, or whose episode hit an infrastructure error, is closed and
    replaced by a fresh one (`replace`, at most `replace_attempts` fresh boxes per reset)."""

    def __init__(self, n: int, backend: str, *, cpus: float, mem: str, workers: int, image: str,
                 disk_mb: int = 0, replace_attempts: int = 3, executor: str = "auto"):
        self.workers = int(workers)
        self.replace_attempts = int(replace_attempts)
        limits = dict(cpus=float(cpus), mem_limit=str(mem), executor=str(executor)) if backend == "docker" else {}
        if int(disk_mb) > 0:
            limits["disk_limit_mb"] = int(disk_mb)
        image = image if backend == "docker" else None
        if backend == "docker":   # sandboxes are made in worker threads: install SIGTERM cleanup here
            install_cleanup_hooks()
            # containers of processes on this host that died without cleaning up (SIGKILL, e.g. a
            # killed rollout worker) would hold memory and disk for the rest of the run
            if n_dead := cleanup_leaked(only_dead_owners=True):
                print(f"[pool] removed {n_dead} sandbox(es) left by dead processes", file=sys.stderr, flush=True)
        self.image = image
        self._open = lambda img=None: open_sandbox(backend, img or image, **limits)
        self.counters = {"sandboxes_replaced": 0, "image_switches": 0}
        self.ready_use: dict[int, dict] = {}   # box -> sandbox seconds/actions of its last `ready`
        self._lock = threading.Lock()
        with ThreadPoolExecutor(self.workers) as ex:
            self.boxes = list(ex.map(lambda _: self._open(), range(int(n))))
        self.images = [image] * len(self.boxes)   # each box's image (a family with per-task images switches them)

    @classmethod
    def from_config(cls, c, n: int | None = None) -> SandboxPool:
        e = c.exp
        return cls(int(n or e.pool_size), e.backend, cpus=e.sandbox_cpus, mem=e.sandbox_mem,
                   workers=int(c.agent.num_tool_workers), image=str(e.sandbox_image),
                   disk_mb=int(e.sandbox_disk_mb), replace_attempts=int(e.sandbox_replace_attempts),
                   executor=str(e.get("sandbox_executor", "auto")))

    def map(self, fn, *its):
        with ThreadPoolExecutor(self.workers) as ex:
            return list(ex.map(fn, *its))

    def replace(self, i: int, why: str, image: str | None = None) -> None:
        """Close box `i` (whatever state it is in) and put a fresh sandbox (of `image`, default the
        box's current one) in its place. `why` None: an image switch, not a failure."""
        old = self.boxes[i]
        try:
            old.close()
        except SandboxError as e:       # a dead box may fail to close cleanly: it is gone either way
            print(f"[pool] closing sandbox {i} failed ({e}); replacing it anyway", file=sys.stderr, flush=True)
        image = image or self.images[i]
        self.boxes[i] = self._open(image)
        self.images[i] = image
        with self._lock:
            self.counters["sandboxes_replaced" if why is not None else "image_switches"] += 1
        if why is not None:
            print(f"[pool] sandbox {i} replaced: {why[:200]}", file=sys.stderr, flush=True)

    def ready(self, i: int, reset: ResetStep | Callable, image: str | None = None, task=None) -> object:
        """Box `i` made ready for an episode: reopened on `image` if given and different (a family
        with per-task images), `prepare()` (leftover agent processes killed, health checked) and
        the task's reset -- a `ResetStep` runs inside prepare's action (one round-trip), a callable
        `reset(box)` after it. Any failure there is the box's, not an episode's: it is replaced
        and the reset retried, up to `replace_attempts` fresh boxes; then `SandboxInfraError`
        (the engine itself is failing). `task` names the task in a failed reset's message."""
        if image is not None and self.image is not None and image != self.images[i]:
            self.replace(i, None, image)
        last = None
        use = dict(prepare_s=0.0, reset_s=0.0, actions=0)
        self.ready_use[i] = use
        for attempt in range(self.replace_attempts + 1):
            if attempt:
                self.replace(i, f"reset failed: {last}")
            box = self.boxes[i]
            try:
                if isinstance(reset, ResetStep):   # one action: its time counts as prepare_s
                    steps = [("prepare_s", lambda b=box: check_reset(
                        b.prepare(reset.command, workdir=reset.workdir, timeout=reset.timeout), task))]
                else:
                    steps = [("prepare_s", box.prepare), ("reset_s", lambda b=box: reset(b))]
                for phase, fn in steps:
                    mark = meter_of(box).read()
                    try:
                        fn()
                    finally:
                        _charge(use, box, mark, phase)
                return box
            except (SandboxError, RuntimeError) as e:     # dead container, engine error, failed reset exec
                last = f"{type(e).__name__}: {e}"
        raise SandboxInfraError(f"sandbox {i}: {self.replace_attempts} fresh sandboxes failed to reset; last: {last}")

    def close(self):
        try:
            self.map(lambda b: b.close(), self.boxes)
        except RuntimeError:        # at interpreter exit (atexit) no new threads: one by one
            for b in self.boxes:
                b.close()


SANDBOX_USE_KEYS = ("prepare_s", "reset_s", "tool_s", "verify_s", "actions")   # info keys "sandbox_<k>"


def _charge(use: dict, box, mark: tuple[int, float], phase: str) -> None:
    """Add `box`'s sandbox seconds since `mark` (its meter's earlier reading) to `use[phase]` and
    its actions to `use["actions"]`."""
    a1, s1 = meter_of(box).read()
    use[phase] = use.get(phase, 0.0) + s1 - mark[1]
    use["actions"] = use.get("actions", 0) + a1 - mark[0]


def _add_use(used: list[dict], boxes, marks, phase: str) -> None:
    """`_charge` each box's phase since its mark (a phase the boxes ran concurrently)."""
    for u, sb, mark in zip(used, boxes, marks):
        _charge(u, sb, mark, phase)


def trim_segment(seg: Segment) -> Segment:
    """Drop tokens after the last model token (the final observation): they carry no loss and,
    the model being causal, do not change any trained log-prob; keeps rows in fewer buckets."""
    hit = np.nonzero(np.asarray(seg.loss_mask))[0]
    n = int(hit[-1]) + 1 if len(hit) else len(seg.tokens)
    ri = None if seg.router_indices is None else seg.router_indices[:, :n]
    return Segment(seg.tokens[:n], seg.loss_mask[:n], seg.logprobs[:n], seg.policy_versions[:n], ri)


def task_image(family: Family, task) -> str | None:
    """The image `task`'s episode needs (families with per-task images), else None (the pool's)."""
    return family.image_of(task) if family.image_of is not None else None


def rollout_batch(family: Family, tasks, policy, pool: SandboxPool, c, tok):
    """One episode per task (len(tasks) <= pool size) -> (trajectories, rewards, infos).
    An infrastructure failure (module docstring) gets reward 0.0 and `info["infra"] = True` with
    the error in `info["failure"]`: a placeholder the caller must not train on; its box is replaced."""
    if len(tasks) > len(pool.boxes):
        raise ValueError(f"{len(tasks)} tasks for a pool of {len(pool.boxes)} sandboxes")
    n = len(tasks)
    boxes = pool.map(lambda i, t: pool.ready(i, family.reset_step(t), task_image(family, t), task=t),
                     range(n), tasks)
    eps = [make_episode(family, t, sb, tok, c.agent) for t, sb in zip(tasks, boxes)]
    used = [dict(pool.ready_use.get(i, {})) for i in range(n)]
    marks = [meter_of(sb).read() for sb in boxes]
    trajs = run_episodes(policy, eps, num_tool_workers=pool.workers)
    _add_use(used, boxes, marks, "tool_s")
    for tr in trajs:
        tr.segments = [trim_segment(sg) for sg in tr.segments]

    def score(t, sb, tr):
        if tr.infra:        # the box is dead: nothing to verify
            return None
        return verify(t, sb, tr.final_answer, timeout=float(c.exp.verify_timeout_s), check_edits=family.check_edits)

    marks = [meter_of(sb).read() for sb in boxes]
    vs = pool.map(score, tasks, boxes, trajs)
    _add_use(used, boxes, marks, "verify_s")
    rs, infos = [], []
    for i, (tr, v) in enumerate(zip(trajs, vs)):
        use = {f"sandbox_{k}": used[i].get(k, 0) for k in SANDBOX_USE_KEYS}
        failure = tr.failure if tr.infra else (v.infra_error if v.infra else "")
        if failure:
            pool.replace(i, failure)
            rs.append(0.0)
            infos.append(dict(infra=True, failure=failure, end=tr.end_reason if tr.infra else "verify_infra",
                              gen_tokens=tr.num_generated_tokens, **tr.stats, **use))
            continue
        r, info = rewards.total_reward(v.reward, tr.stats, c.rl)
        rs.append(float(r))
        infos.append(dict(info, verifier=v.reward, end=tr.end_reason, infra=False,
                          gen_tokens=tr.num_generated_tokens, **tr.stats, **use))
        if tr.failure:
            infos[-1]["failure"] = tr.failure
    return trajs, rs, infos


class ExperimentEnv:
    """The task family of an experiment config (`cfg.exp`) and a pool of reused sandboxes, made
    on first use (`exp.pool_size`, `exp.backend`, `exp.sandbox_image`); the owner closes it.
    `seed_of(request)` is the task seed of a rollout request. A `pool` passed in is borrowed
    (several envs of one driver share it, e.g. experiments/selfsum.py's strategies): `close`
    leaves it open."""

    def __init__(self, cfg, seed_of: Callable[[dict], int], *, pool: SandboxPool | None = None):
        self.cfg = cfg
        self.seed_of = seed_of
        self.family = family_from_config(cfg.exp)
        self._pool: SandboxPool | None = pool
        self._owns_pool = pool is None
        self._counters = {"infra_episodes": 0, "group_retries": 0}

    @property
    def pool(self) -> SandboxPool:
        if self._pool is None:
            self._pool = SandboxPool.from_config(self.cfg)
        return self._pool

    @property
    def counters(self) -> dict:
        """Cumulative infrastructure counters of this env (added to by every `rollouts` call)."""
        return dict(self._counters, **(self._pool.counters if self._pool is not None else {}))

    def rollouts(self, requests: Sequence[dict], policy, tok) -> list[tuple]:
        """All `len(requests) * group_size` rollouts in ONE batched generation. Returns one
        (trajectories, rewards, infos) per request. A group with an infrastructure failure is rolled
        out again, whole, on fresh sandboxes (at most `rl.infra.group_retries` more times, the
        retried groups batched together); one still failing has `infos[j]["group_failed"] = True`."""
        G = int(self.cfg.rl.group_size)
        retries = int(self.cfg.rl.infra.group_retries)
        out: list = [None] * len(requests)
        todo = list(range(len(requests)))
        for attempt in range(retries + 1):
            if attempt:
                self._counters["group_retries"] += len(todo)
                print(f"[env] retrying {len(todo)} group(s) after infrastructure failures "
                      f"(attempt {attempt}/{retries})", file=sys.stderr, flush=True)
            tasks = [self.family.make_task(self.seed_of(requests[i])) for i in todo for _ in range(G)]
            trajs, rs, infos = rollout_batch(self.family, tasks, policy, self.pool, self.cfg, tok)
            failed = []
            for j, i in enumerate(todo):
                grp = (trajs[j * G:(j + 1) * G], rs[j * G:(j + 1) * G], infos[j * G:(j + 1) * G])
                bad = sum(bool(x["infra"]) for x in grp[2])
                self._counters["infra_episodes"] += bad
                out[i] = grp
                if bad:
                    failed.append(i)
            todo = failed
            if not todo:
                break
        for i in todo:
            for x in out[i][2]:
                x["group_failed"] = True
        return out

    def close(self) -> None:
        if self._pool is not None and self._owns_pool:
            self._pool.close()
        self._pool = None
