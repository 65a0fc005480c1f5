"""Asynchronous RL: the orchestrator of a trainer and rollout workers (docs/SPEC.md §4, §4.1).

The same three pieces as the synchronous loop (`horizon.rl.runtime.core`: prompt schedule, group
rollout, train step), spread over processes (`processes`; each gets its XLA flags from
`async_setup.child_env` at its start; the orchestrator runs no JAX computation):

    orchestrator (`Orchestrator.run`): assigns step t's prompts (`PromptSchedule`)
      │                        and submits its generation batches under the staleness bound
      ├─ trainer process      `trainer_main`: waits for the groups of step t, `train_groups`,
      │                        checkpoints, publishes version t+1 (weight_sync: delta chain on a shared dir)
      └─ rollout workers ×W   `rollout_worker_main`: take a generation batch, load the newest weights,
                               `rollout_groups` with in-flight weight updates, write each group
                               to the GroupStore

All data moves through storage, never through the queues: the trainer can be SIGKILLed at any
point and restarted without corrupting anything. ``weights/`` and ``groups/`` live under
`async_setup.data_root` (the run directory, or `async_.storage_url` + its name); ``ckpt/``,
``scheduler.json`` and ``trainer.jsonl`` / ``events.jsonl`` stay in the run directory.

**Slots.** Every group is a *slot* with a fixed index s; it moves through ``SLOT_STATES``
(timestamps kept per slot). Step t trains on slots ``[t*N, (t+1)*N)`` (N = `rl.prompts_per_step`),
in slot order, requested in generation batches of `rl.slots_per_batch` (one queue item each), so
a batch, its sampling key and hence its samples do not depend on timing: a restarted trainer
reproduces the uninterrupted run bit for bit (tests/rl/test_async.py), and at
``max_staleness = 0`` this runtime trains on exactly the groups `loop.run_rl` trains on
(tests/rl/test_one_loop.py).

**Staleness bound (admission control).** Slot s is consumed by weights version ``s // N``; a
rollout started when version v is the newest only contains tokens of versions >= v. Admitting
slot s only while ``s // N - v <= max_staleness`` bounds every trained token's staleness, with
no data dropped; ``max_staleness = 0`` is the synchronous loop. In-flight weight updates make
long rollouts *less* stale than their start version.

**Restart.** The trainer restores its newest checkpoint and consumes the ready groups of the
next step (nothing is regenerated); the scheduler reloads ``scheduler.json`` and re-requests
whole any generation batch with a slot without a group. Rollout-level checkpoints
(`storage.RolloutCheckpoints`) are an optional restore path for long multi-turn rollouts that
this loop does not use (a killed worker's slot is re-requested from scratch). The pool
(`ray_pool.RayPool`) replaces a lost trainer group and lost rollout workers (their unfinished
slots go to the replacement); docs/SCALING.md.
"""

from __future__ import annotations

import collections
import json
import pathlib
import time
from collections.abc import Callable

from horizon.rl.runtime import core as runtime
from horizon.rl.runtime import storage, weight_sync
from horizon.rl.runtime.async_setup import append_jsonl, data_root, worker_queue_depth
from horizon.rl.runtime.checks import validate_async
from horizon.rl.runtime.pools import POOLS, WorkerPool
from horizon.rl.runtime.ray_pool import RayPool
from horizon.utils.files import url_dir
from horizon.utils.progress import progress

SLOT_STATES = ("requested", "generating", "scored", "grouped", "trained")
OUTSTANDING = ("requested", "generating", "scored")      # a slot whose group is not written yet


def make_pool(kind: str, cfg) -> WorkerPool:
    """The `pools.POOLS` pool of `kind` (`async_.pool`)."""
    if kind == "ray":
        return RayPool(cfg)
    raise ValueError(f"unknown pool kind {kind!r} ({' | '.join(POOLS)})")


class StalenessScheduler:
    """Admission control: slot s may start iff ``s // N - newest_version <= max_staleness``."""

    def __init__(self, groups_per_step: int, max_staleness: int):
        if groups_per_step < 1 or max_staleness < 0:
            raise ValueError(f"need groups_per_step >= 1 and max_staleness >= 0, got {groups_per_step}, "
                             f"{max_staleness}")
        self.N, self.max_staleness = int(groups_per_step), int(max_staleness)

    def step_of(self, slot: int) -> int:
        return int(slot) // self.N

    def can_admit(self, slot: int, newest_version: int | None) -> bool:
        return newest_version is not None and self.step_of(slot) - newest_version <= self.max_staleness

    def capacity(self, newest_version: int) -> int:
        """Number of slots that may have been started once `newest_version` is published."""
        return (newest_version + self.max_staleness + 1) * self.N


class Orchestrator:
    """Runs the async loop (module docstring) until `num_steps` trainer steps are published.

    `kill_trainer_at`: fault injection for tests — SIGKILL the trainer once that weights
    version is published (and restart it, like every unexpected trainer death, up to
    `max_trainer_restarts` times). A rollout worker that dies (`kill_worker_at`: the same injection,
    for worker 0 once that version is out and it is generating a batch) is replaced and the
    unfinished slots of the batches queued on it are queued again on the replacement (a slot
    whose group was written is never generated again), up to `max_worker_restarts` times.
    `fault_hook(orchestrator, newest_version)`,
    called every poll, injects other faults (tests: removing a Ray node).
    """

    def __init__(self, cfg, run_dir: str | pathlib.Path, *, num_steps: int, pool: WorkerPool | None = None,
                 kill_trainer_at: int | None = None, max_trainer_restarts: int = 3,
                 kill_worker_at: int | None = None, max_worker_restarts: int = 8,
                 fault_hook: Callable[[Orchestrator, int | None], None] | None = None):
        validate_async(cfg)
        self.cfg, self.run_dir = cfg, pathlib.Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.num_steps = int(num_steps)
        self.pool = pool or make_pool(str(cfg.async_.pool), cfg)
        self.kill_trainer_at = kill_trainer_at
        self.max_trainer_restarts = int(max_trainer_restarts)
        self.kill_worker_at, self.max_worker_restarts = kill_worker_at, int(max_worker_restarts)
        self.fault_hook = fault_hook
        self.worker_restarts = 0
        self.batches: dict[int, list[dict]] = {}        # first slot -> a submitted generation batch
        self.assigned: dict[int, int] = {}              # first slot -> the worker it was queued on
        a = cfg.async_
        self.N = int(cfg.rl.prompts_per_step)
        self.sched = StalenessScheduler(self.N, int(a.max_staleness))
        self.data = data_root(cfg, self.run_dir)
        self.store = storage.GroupStore(f"{self.data}/groups")
        self.schedule = runtime.PromptSchedule(cfg, self.num_steps, lag=int(a.max_staleness))
        st = storage.SchedulerState.load(self.run_dir / "scheduler.json")
        if st is None:
            st = storage.SchedulerState(self.run_dir / "scheduler.json")
        else:
            self.schedule.load_state_dict(st.schedule)
        self.state = st
        self.slots: dict[int, dict] = {}
        self.events_log = self.run_dir / "events.jsonl"
        self.trainer_restarts = 0
        self.trainer_killed = False      # `kill_trainer_at` has fired (in this `run`)

    def _batches(self, step: int) -> list[list[dict]]:
        """`step`'s generation batches, assigning its prompts first if new (after feeding the
        schedule the rollout stats of every step it needs: those groups are in the store, since
        admission lets step t start only once version t - max_staleness is published)."""
        sch = self.schedule
        if step not in sch.requests:
            while sch.fed < step - sch.lag:
                f = sch.fed
                sch.feed(f, [self.store.get(x) for x in range(f * self.N, (f + 1) * self.N)])
            if sch.assign(step) is None:
                raise RuntimeError("prompt set exhausted (single epoch)")
            self.state.schedule = sch.state_dict()
            self.state.save()
        return sch.batches(step)

    def _request(self, batch: list[dict], version: int, ready: set[int]) -> int:
        """Submit one generation batch (all its slots: the batch and its key stay those of an
        uninterrupted run; a slot already in the store is not overwritten) to the worker with the
        fewest outstanding slots. Returns slots made outstanding."""
        load = collections.Counter(d.get("worker") for d in self.slots.values() if d.get("state") in OUTSTANDING)
        w = min(range(int(self.cfg.async_.num_rollout_workers)), key=lambda i: (load[f"w{i}"], i))
        first = int(batch[0]["slot"])
        self.batches[first] = [dict(r, min_version=int(version)) for r in batch]
        self.assigned[first] = w
        self.pool.submit(self.batches[first], w)
        n = 0
        for r in batch:
            if r["slot"] not in ready:
                self.slots[r["slot"]] = dict(state="requested", requested=time.time(), prompt_id=r["prompt_id"],
                                             admitted_at_version=int(version), worker=f"w{w}")
                n += 1
        return n

    def run(self) -> dict:
        """Start the trainer and the workers, then poll (every `async_.poll_s`) until version
        `num_steps` is published: supervise the processes, admit generation batches, log events."""
        a = self.cfg.async_
        weights = url_dir(f"{self.data}/weights")      # polled every `poll_s`: resolve the URL once
        t_start = time.time()
        # resume: groups already on disk are not regenerated
        ready = set(self.store.ready_slots())
        for s in ready:
            self.slots[s] = dict(state="grouped", resumed=True)
        self.pool.start_trainer(self.cfg, str(self.run_dir), self.num_steps)
        self.pool.start_rollout_workers(self.cfg, str(self.run_dir), int(a.num_rollout_workers))
        step, j = 0, 0                 # the next generation batch to request: batch j of step `step`
        self.trainer_killed = False
        bar = progress(total=self.num_steps, desc=f"async RL {self.run_dir.name}", unit="version")
        try:
            while True:
                v = weight_sync.latest_version(weights)
                if v is not None:
                    self._mark_trained(v)
                    bar.update(max(0, v - bar.n))       # published weights versions = trainer steps done
                    if v >= self.num_steps:
                        break
                self._supervise(v)
                step, j = self._admit(step, j, v, ready)
                for e in self.pool.events(float(a.poll_s)):
                    self._on_event(e)
        finally:
            bar.close()
            self.pool.close()
        wall = time.time() - t_start
        return dict(wall_s=wall, trainer_restarts=self.trainer_restarts, worker_restarts=self.worker_restarts,
                    slots=self.slots)

    def _mark_trained(self, v: int) -> None:
        """Version `v` is published: the grouped slots of steps < v are trained."""
        for s, d in self.slots.items():
            if d["state"] == "grouped" and self.sched.step_of(s) < v:
                d["state"], d["trained"] = "trained", time.time()

    def _supervise(self, v: int | None) -> None:
        """One poll's faults (newest version `v`): the injected kills, a restart of a dead trainer,
        `fault_hook`, the replacement of dead rollout workers."""
        if self.kill_trainer_at is not None and not self.trainer_killed and v is not None and v >= self.kill_trainer_at:
            self.pool.kill_trainer()
            self.trainer_killed = True
            append_jsonl(self.events_log, dict(kind="trainer_killed", version=v, time=time.time()))
        if not self.pool.trainer_alive():
            code = self.pool.trainer_exitcode()
            if self.trainer_restarts >= self.max_trainer_restarts:
                raise RuntimeError(f"trainer died (exit {code}) {self.trainer_restarts} times")
            self.trainer_restarts += 1
            append_jsonl(self.events_log, dict(kind="trainer_restart", exitcode=code, time=time.time()))
            self.pool.start_trainer(self.cfg, str(self.run_dir), self.num_steps)
        if (self.kill_worker_at is not None and v is not None and v >= self.kill_worker_at
                and any(d.get("state") == "generating" and d.get("worker") == "w0" for d in self.slots.values())):
            self.kill_worker_at = None
            self.pool.kill_worker(0)
            append_jsonl(self.events_log, dict(kind="worker_killed", worker="w0", version=v, time=time.time()))
        if self.fault_hook is not None:
            self.fault_hook(self, v)
        self._replace_lost_workers()

    def _admit(self, step: int, j: int, v: int | None, ready: set[int]) -> tuple[int, int]:
        """Request generation batches from batch `j` of step `step` on, while the staleness bound
        (newest version `v`) and the workers' queues (`worker_queue_depth`) admit them; returns the
        next batch to request, (step, j)."""
        max_outstanding = int(self.cfg.async_.num_rollout_workers) * worker_queue_depth(self.cfg)
        outstanding = sum(d["state"] in OUTSTANDING for d in self.slots.values())
        while step < self.num_steps and self.sched.can_admit(step * self.N, v):
            batches = self._batches(step)
            if j == len(batches):
                step, j = step + 1, 0
                continue
            if all(r["slot"] in ready for r in batches[j]):
                j += 1
                continue
            if outstanding and outstanding + len(batches[j]) > max_outstanding:
                break
            outstanding += self._request(batches[j], v, ready)
            j += 1
        return step, j

    def _on_event(self, e: dict) -> None:
        """A worker event: the slot's state moves on (a finished slot stays finished when a re-requested
        batch reports it again) and the event goes to events.jsonl."""
        append_jsonl(self.events_log, e)
        d = self.slots.setdefault(e["slot"], {})
        if d.get("state") in ("grouped", "trained"):
            return
        d["state"] = e["kind"]
        d[e["kind"]] = e["time"]
        d["worker"] = e.get("worker", d.get("worker"))
        if e["kind"] == "grouped":
            d.update({k: e[k] for k in ("worker", "tokens", "seconds", "min_version", "max_version",
                                        "start_version", "switches", "reward", "wrote")})

    def _replace_lost_workers(self) -> None:
        """Replace every dead rollout worker and queue again, on its replacement, the unfinished
        slots of the batches that were queued on it (a slot whose group is written is never
        generated again; the re-queued batch's sampling key is that of its first slot, as always)."""
        for i, alive in enumerate(self.pool.workers_alive()):
            if alive:
                continue
            if self.worker_restarts >= self.max_worker_restarts:
                raise RuntimeError(f"rollout workers died {self.worker_restarts} times")
            self.worker_restarts += 1
            for e in self.pool.events(0.0):        # what the dead worker announced before it died
                self._on_event(e)
            firsts = sorted(f for f, w in self.assigned.items() if w == i and any(
                self.slots.get(r["slot"], {}).get("state") in OUTSTANDING for r in self.batches[f]))
            lost = [r["slot"] for f in firsts for r in self.batches[f]
                    if self.slots.get(r["slot"], {}).get("state") in OUTSTANDING]
            append_jsonl(self.events_log, dict(kind="worker_restart", worker=f"w{i}", lost_slots=lost,
                                               time=time.time()))
            self.pool.restart_worker(i, self.cfg, str(self.run_dir))
            for f in firsts:
                self.pool.submit([r for r in self.batches[f] if r["slot"] in lost], i)
            for s in lost:
                self.slots[s].update(state="requested", requested_again=time.time())


# ----------------------------------------------------------------------------- summaries
def summarize_sync(run_dir, wall_s: float | None = None) -> dict:
    """`summarize`'s numbers for a `processes.sync_main` run (its metrics.jsonl)."""
    p = pathlib.Path(run_dir) / "metrics.jsonl"
    recs = [r for r in map(json.loads, p.read_text().splitlines()) if r.get("phase") == "rl"]
    span = recs[-1]["time_s"] if recs else None
    toks = int(sum(r["gen_tokens"] for r in recs))
    return dict(steps=len(recs), rewards=[r["reward_mean"] for r in recs], times=[r["time_s"] for r in recs],
                generated_tokens=toks, rollout_tokens_per_s=toks / span if span else None,
                trainer_steps_per_s=len(recs) / span if span else None, wall_s=wall_s if wall_s is not None else span)


def read_trainer_log(run_dir) -> list[dict]:
    """The records of a run directory's trainer.jsonl (`processes.trainer_main`); [] if none."""
    p = pathlib.Path(run_dir) / "trainer.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def summarize(run_dir, wall_s: float | None = None) -> dict:
    """Throughput, staleness histogram and reward curve from a run directory's logs."""
    recs = read_trainer_log(run_dir)
    steps = {}
    for r in recs:
        if r["event"] == "step":
            steps[r["step"]] = r            # a restarted trainer may log a step twice; keep the last
    starts = [r for r in recs if r["event"] == "start"]
    t0 = starts[0]["time"] if starts else None
    hist: collections.Counter = collections.Counter()
    toks = 0
    for r in steps.values():
        for k, n in r["staleness"].items():
            hist[int(k)] += int(n)
        toks += r["generated_tokens"]
    ordered = [steps[k] for k in sorted(steps)]
    t_end = ordered[-1]["time"] if ordered else None
    span = (t_end - t0) if (t0 and t_end) else None
    return dict(steps=len(ordered), rewards=[r["reward_mean"] for r in ordered],
                times=[r["time"] - t0 for r in ordered] if t0 else [],
                staleness_hist=dict(sorted(hist.items())), generated_tokens=toks,
                rollout_tokens_per_s=toks / span if span else None,
                trainer_steps_per_s=len(ordered) / span if span else None,
                trainer_wait_s=float(sum(r["wait_s"] for r in ordered)),
                trainer_train_s=float(sum(r["train_s"] for r in ordered)),
                publish=[p for r in ordered for p in r.get("publish", [])], wall_s=wall_s)
