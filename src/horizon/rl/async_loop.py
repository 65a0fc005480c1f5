"""Asynchronous RL: scheduler, trainer and rollout-worker processes (SPEC §4, §4.1, fault tolerance).

Processes (one machine, `multiprocessing` spawn context, JAX in each worker; the
orchestrator itself never imports JAX):

    orchestrator (this module, `Orchestrator.run`)
      ├─ trainer process      `trainer_main`: waits for the groups of step t, trains, checkpoints,
      │                        publishes version t+1 (weight_sync: delta chain on a shared dir)
      └─ rollout workers ×W   `rollout_worker_main`: take a slot request, load the newest weights,
                               roll out one prompt group with in-flight weight updates
                               (`sampler.generate` polling the weight source), score it, write it to the GroupStore

All data moves through the shared run directory (the stand-in for object storage), never
through the trainer's pipes: the trainer can be SIGKILLed at any point and restarted without
corrupting a queue. Layout: ``weights/`` (weight_sync), ``groups/`` (storage.GroupStore),
``ckpt/`` (orbax, step level), ``scheduler.json`` (slot table + prompt sampler),
``trainer.jsonl`` / ``events.jsonl`` (logs).

**Slots.** Every group is a *slot* with a fixed index s; it moves through
``requested -> generating -> scored -> grouped -> trained`` (timestamps kept per slot). Step t
trains on slots ``[t*N, (t+1)*N)`` (N = `rl.prompts_per_step`), in slot order, so the batch
composition is a pure function of the slot contents: a restarted trainer given the same groups
reproduces the uninterrupted run bit for bit (tests/rl/test_async.py).

**Staleness bound (admission control, SkyRL style).** Slot s is consumed at step ``s // N``,
i.e. by weights version ``s // N``; a rollout started when version v is the newest published
one only contains tokens of versions >= v. The scheduler admits slot s only while
``s // N - v <= max_staleness``, so every trained token has staleness
``trainer_version - token_version <= max_staleness`` — guaranteed, with no data dropped.
``max_staleness = 0`` is the synchronous loop: the rollouts of step t start only once version
t is published. Larger bounds let generation run ahead of training (throughput vs staleness).
In-flight updates then make long rollouts *less* stale than their start version.

**Restart.** Trainer: restores the newest orbax checkpoint (params + Adam state + step),
re-adopts the newest published weights as the delta base (re-publishing an existing version
checks it is bit-identical), then consumes the ready groups of the next step from the store —
nothing is regenerated. Scheduler: reloads ``scheduler.json``; slots with a group file are
"grouped", assigned slots without one are re-requested with the same prompt and seed.
Rollout-level checkpoints (sandbox snapshots, `storage.RolloutCheckpoints`) exist as an
optional restore path for long multi-turn rollouts; this loop does not use them (a
killed worker's slot is re-requested from scratch).

**Distributed engines.** `WorkerPool` is the adapter: `MultiprocessingPool` implements it
with local processes; a Ray (or Slurm, k8s) implementation would start the same
`trainer_main` / `rollout_worker_main` functions as remote actors and carry requests/events
through its queues; the shared directory becomes object storage. Ray is not installed here,
so no Ray pool is shipped (`make_pool("ray")` raises with that explanation).

`run_sync_inprocess` is the single-process synchronous baseline (generate, then train, in
one process — like experiments/rl.py) used for the equal-wall-time comparison.
"""

from __future__ import annotations

import abc
import collections
import json
import multiprocessing as mp
import os
import pathlib
import queue as queue_mod
import signal
import time
from typing import Any

import numpy as np

from horizon.rl import storage, weight_sync
from horizon.utils.seeds import run_keys

def numpy_init(mcfg, seed: int) -> dict:
    """`horizon.model.params.numpy_init`, imported lazily: this module keeps jax out of import time
    so worker processes can set their XLA flags first."""
    from horizon.model.params import numpy_init as init  # noqa: PLC0415

    return init(mcfg, seed)


SLOT_STATES = ("requested", "generating", "scored", "grouped", "trained")


# ----------------------------------------------------------------------------- config helpers
def batch_slots(cfg) -> int:
    """Slots a worker batches into one generation: `async_.slots_per_batch`, 0 = one step's
    groups (`rl.prompts_per_step`, as experiments/rl.py generates). Computed at use, so an
    override of `rl.prompts_per_step` moves it."""
    n = int(cfg.async_.slots_per_batch)
    return n if n > 0 else int(cfg.rl.prompts_per_step)


def worker_queue_depth(cfg) -> int:
    """Outstanding slot requests per worker: `async_.queue_depth`, 0 = `rl.prompts_per_step`."""
    n = int(cfg.async_.queue_depth)
    return n if n > 0 else int(cfg.rl.prompts_per_step)


def prompt_ids_for(cfg, total: int) -> list[str]:
    """The prompt set: toy ids, or the experiment family's RL prompts — train seeds after the
    `exp.n_sft_tasks` SFT ones, exactly experiments/rl.py's prompt set."""
    a = cfg.async_
    if a.env == "toy":
        return [f"toy_{i}" for i in range(int(a.prompt_start), int(a.prompt_start) + total)]
    from horizon.rl.workers import experiment_prompt_id  # noqa: PLC0415
    from horizon.env.families import family_from_config  # noqa: PLC0415

    seeds = family_from_config(cfg.exp).seeds("train", total, int(cfg.exp.n_sft_tasks))
    return [experiment_prompt_id(str(cfg.exp.env), s) for s in seeds]


def initial_params(cfg):
    """The policy the run starts from: `async_.init_from` (a finished SFT checkpoint dir, e.g.
    runs/rl_tiny/sft: the same warm start as experiments/rl.py) or, if empty, `numpy_init`."""
    d = str(cfg.async_.get("init_from", "") or "")
    if not d:
        return numpy_init(cfg.model, int(cfg.seed))
    from horizon.rl.loop import load_sft_params  # noqa: PLC0415

    return load_sft_params(cfg, d)


def child_env(cfg) -> dict[str, str]:
    """Environment for JAX child processes: CPU, one device, few threads (shared machine)."""
    n = int(cfg.async_.threads_per_process)
    flags = "--xla_force_host_platform_device_count=1"
    if n == 1:
        flags += " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    return {"XLA_FLAGS": flags, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
            "OMP_NUM_THREADS": str(n), "OPENBLAS_NUM_THREADS": str(n), "MKL_NUM_THREADS": str(n)}


def _setup_jax(cfg) -> None:
    import jax  # noqa: PLC0415

    d = str(cfg.exp.compilation_cache_dir)
    if d:
        jax.config.update("jax_compilation_cache_dir", str(pathlib.Path(d).resolve()))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def make_publisher(cfg, directory) -> weight_sync.WeightPublisher:
    a = cfg.async_
    return weight_sync.WeightPublisher(directory, dtype=str(a.publish_dtype), codec=str(a.codec),
                                       level=int(a.codec_level), full_every=int(a.full_every),
                                       keep_fulls=int(a.keep_fulls), shard_elems=int(a.shard_elems),
                                       num_threads=int(a.publish_threads))


def _jsonl(path: pathlib.Path, rec: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")
        f.flush()
        os.fsync(f.fileno())


def token_staleness(groups_records, step: int) -> dict[int, int]:
    """Histogram {staleness: token count} of `step - token version` over the model tokens."""
    h: collections.Counter = collections.Counter()
    for r in groups_records:
        for t in r.trajectories:
            for s in t.segments:
                v = np.asarray(s.policy_versions)[np.asarray(s.loss_mask, bool)]
                for k, n in zip(*np.unique(step - v, return_counts=True)):
                    h[int(k)] += int(n)
    return dict(sorted(h.items()))


# ----------------------------------------------------------------------------- trainer process
def trainer_main(cfg, run_dir: str, num_steps: int) -> None:
    """Trainer process: consume groups of step t (slot order), train, checkpoint, publish t+1."""
    _setup_jax(cfg)
    import jax  # noqa: PLC0415

    from horizon.rl import batch as rlbatch  # noqa: PLC0415
    from horizon.rl import trainer  # noqa: PLC0415
    from horizon.train.checkpoint import Checkpointer  # noqa: PLC0415

    a = cfg.async_
    run = pathlib.Path(run_dir)
    N = int(cfg.rl.prompts_per_step)
    store = storage.GroupStore(run / "groups")
    log = run / "trainer.jsonl"
    state = trainer.init_state(initial_params(cfg), cfg)
    ckpt = Checkpointer(run / "ckpt", every=int(cfg.rl.checkpoint_every), keep=int(cfg.rl.max_checkpoints))
    start = 0
    restored = ckpt.restore_latest(state)
    if restored is not None:
        state, meta = restored
        start = int(meta["step"])
    pub = make_publisher(cfg, run / "weights")
    pub.resume()
    apub = weight_sync.AsyncPublisher(pub)
    apub.submit(state.params, start)      # version `start` (re-publish = bit-identity check)
    apub.wait()
    _jsonl(log, dict(event="start", pid=os.getpid(), step=start, restored=restored is not None, time=time.time()))
    for step in range(start, num_steps):
        slots = range(step * N, (step + 1) * N)
        t0 = time.time()
        while not all(store.has(s) for s in slots):
            time.sleep(float(a.poll_s))
        t_wait = time.time() - t0
        recs = [store.get(s) for s in slots]
        b = rlbatch.build_batch_from_config([r.trajectories for r in recs],
                                            np.asarray([r.rewards for r in recs], np.float32), cfg)
        state, m = trainer.train_step(state, b, cfg=cfg)
        m = {k: float(v) for k, v in jax.device_get(m).items()}
        t_train = time.time() - t0 - t_wait
        ckpt.save(step + 1, state, {"step": step + 1}, force=step + 1 == num_steps)
        if (step + 1) % int(a.publish_every) == 0 or step + 1 == num_steps:
            apub.submit(state.params, step + 1)
        stats = list(apub.stats)
        _jsonl(log, dict(event="step", step=step + 1, slots=list(slots), pid=os.getpid(), time=time.time(),
                         wait_s=t_wait, train_s=t_train, reward_mean=m["reward_mean"],
                         staleness=token_staleness(recs, step), group_min_versions=[r.min_version for r in recs],
                         generated_tokens=int(sum(r.generated_tokens for r in recs)),
                         publish=[dict(version=s.version, kind=s.kind, ratio=s.ratio, bytes=s.file_bytes,
                                       seconds=s.seconds) for s in stats[-2:]],
                         **{k: m[k] for k in ("loss", "grad_norm", "entropy", "sampler_logprob_diff") if k in m}))
    apub.close()
    ckpt.close()
    _jsonl(log, dict(event="done", pid=os.getpid(), step=num_steps, time=time.time()))


# ----------------------------------------------------------------------------- rollout process
def rollout_worker_main(worker_id: int, cfg, run_dir: str, requests, events) -> None:
    """Rollout worker: request -> newest weights -> group rollout (in-flight updates) -> GroupStore."""
    _setup_jax(cfg)
    import jax  # noqa: PLC0415

    from horizon.data.tokenizer import ByteTokenizer  # noqa: PLC0415
    from horizon.rl import workers  # noqa: PLC0415

    a = cfg.async_
    run = pathlib.Path(run_dir)
    tok = ByteTokenizer(int(cfg.model.vocab_size))
    template = jax.eval_shape(lambda: numpy_init(cfg.model, 0))
    source = workers.WeightSource(run / "weights", template, min_interval_s=float(a.weight_poll_interval_s))
    store = storage.GroupStore(run / "groups")
    env = workers.ENVS[str(a.env)](cfg)       # this worker's environment (its pooled sandboxes)
    base_key = run_keys(cfg.seed)["rollout"]
    name = f"w{worker_id}"
    try:
        _serve(requests, events, env, source, store, cfg, tok, base_key, name)
    finally:
        env.close()


def _serve(requests, events, env, source, store, cfg, tok, base_key, name) -> None:
    """The rollout worker's request loop (`rollout_worker_main`)."""
    import jax  # noqa: PLC0415

    from horizon.rl import sampler, workers  # noqa: PLC0415

    a = cfg.async_
    stop = False
    while not stop:
        req = requests.get()
        if req is None:
            break
        reqs = [req]       # batch the requests already queued (one generation for all their rollouts)
        while len(reqs) < batch_slots(cfg):
            try:
                r = requests.get(timeout=float(a.batch_wait_s))
            except queue_mod.Empty:
                break
            if r is None:
                stop = True
                break
            reqs.append(r)
        for r in reqs:
            events.put(dict(kind="generating", slot=int(r["slot"]), worker=name, time=time.time()))
        source.wait_for(max(int(r["min_version"]) for r in reqs), float(a.weights_timeout_s))
        start_version = source.poll()[1]
        policy = sampler.make_policy(source.poll, cfg, jax.random.fold_in(base_key, int(reqs[0]["seed"])),
                                     chunk_tokens=int(a.chunk_tokens), kv_mode=str(a.kv_mode))
        t0 = time.time()
        results = env.rollouts(reqs, policy, tok)
        dt = time.time() - t0
        for r, (trajs, rs, infos) in zip(reqs, results):
            slot = int(r["slot"])
            lo, hi = storage.group_versions(trajs)
            gen = int(sum(t.num_generated_tokens for t in trajs))
            events.put(dict(kind="scored", slot=slot, worker=name, time=time.time()))
            rec = storage.GroupRecord(slot=slot, prompt_id=r["prompt_id"], trajectories=trajs, rewards=list(rs),
                                      advantages=workers.group_advantages(rs, cfg), min_version=lo, max_version=hi,
                                      start_version=int(start_version), generated_tokens=gen, worker=name,
                                      seconds=dt, infos=infos)
            wrote = store.put(rec)
            events.put(dict(kind="grouped", slot=slot, worker=name, time=time.time(), wrote=wrote,
                            tokens=gen, seconds=dt, min_version=lo, max_version=hi, start_version=int(start_version),
                            switches=int(policy.state["switches"]), reward=float(np.mean(rs)),
                            success=float(np.mean([i.get("verifier", i.get("reward", 0.0)) for i in infos]))))


# ----------------------------------------------------------------------------- worker pools
class WorkerPool(abc.ABC):
    """Where the trainer and rollout workers run (the distributed-engine adapter, module doc)."""

    @abc.abstractmethod
    def start_trainer(self, cfg, run_dir: str, num_steps: int) -> None: ...

    @abc.abstractmethod
    def trainer_alive(self) -> bool: ...

    @abc.abstractmethod
    def trainer_exitcode(self) -> int | None: ...

    @abc.abstractmethod
    def kill_trainer(self) -> None:
        """SIGKILL the trainer (fault injection / shutdown)."""

    @abc.abstractmethod
    def start_rollout_workers(self, cfg, run_dir: str, n: int) -> None: ...

    @abc.abstractmethod
    def submit(self, request: dict) -> None: ...

    @abc.abstractmethod
    def events(self, timeout: float) -> list[dict]:
        """Worker events (dicts with kind/slot/worker/time) received within `timeout` seconds."""

    @abc.abstractmethod
    def close(self) -> None: ...


class MultiprocessingPool(WorkerPool):
    """Local processes (spawn context; env from `child_env` so each JAX process stays small)."""

    def __init__(self, cfg):
        self.ctx = mp.get_context("spawn")
        self.env = child_env(cfg)
        self.trainer = None
        self.workers: list = []
        self.requests = self.ctx.Queue()
        self.event_q = self.ctx.Queue()

    def _spawn(self, target, args):
        old = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)       # spawn children inherit the parent's environment
        try:
            p = self.ctx.Process(target=target, args=args, daemon=True)
            p.start()
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        return p

    def start_trainer(self, cfg, run_dir, num_steps):
        self.trainer = self._spawn(trainer_main, (cfg, run_dir, num_steps))

    def trainer_alive(self):
        return self.trainer is not None and self.trainer.is_alive()

    def trainer_exitcode(self):
        return None if self.trainer is None else self.trainer.exitcode

    def kill_trainer(self):
        if self.trainer is not None and self.trainer.is_alive():
            os.kill(self.trainer.pid, signal.SIGKILL)
            self.trainer.join(30)

    def start_rollout_workers(self, cfg, run_dir, n):
        for i in range(n):
            self.workers.append(self._spawn(rollout_worker_main, (i, cfg, run_dir, self.requests, self.event_q)))

    def submit(self, request):
        self.requests.put(request)

    def events(self, timeout):
        out = []
        try:
            out.append(self.event_q.get(timeout=timeout))
            while True:
                out.append(self.event_q.get_nowait())
        except queue_mod.Empty:
            pass
        return out

    def workers_alive(self) -> list[bool]:
        return [w.is_alive() for w in self.workers]

    def close(self):
        for _ in self.workers:
            self.requests.put(None)
        for w in self.workers:
            w.join(30)
            if w.is_alive():
                os.kill(w.pid, signal.SIGKILL)
                w.join(5)
        if self.trainer is not None:
            self.trainer.join(60)
            if self.trainer.is_alive():
                self.kill_trainer()


def make_pool(kind: str, cfg) -> WorkerPool:
    if kind == "multiprocessing":
        return MultiprocessingPool(cfg)
    if kind == "ray":
        try:
            import ray  # noqa: F401, PLC0415
        except ImportError as e:
            raise ValueError("pool 'ray' needs ray (not installed); implement WorkerPool with ray actors "
                             "running trainer_main / rollout_worker_main (see module docstring)") from e
        raise NotImplementedError("a Ray WorkerPool is not shipped (ray was not available to test it)")
    raise ValueError(f"unknown pool kind {kind!r} (multiprocessing | ray)")


# ----------------------------------------------------------------------------- scheduler
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
    `max_trainer_restarts` times).
    """

    def __init__(self, cfg, run_dir: str | pathlib.Path, *, num_steps: int, pool: WorkerPool | None = None,
                 kill_trainer_at: int | None = None, max_trainer_restarts: int = 3):
        from horizon.rl.checks import validate_async  # noqa: PLC0415  (checks imports the rl layer)

        validate_async(cfg)
        self.cfg, self.run_dir = cfg, pathlib.Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.num_steps = int(num_steps)
        self.pool = pool or make_pool(str(cfg.async_.pool), cfg)
        self.kill_trainer_at = kill_trainer_at
        self.max_trainer_restarts = int(max_trainer_restarts)
        a = cfg.async_
        self.N = int(cfg.rl.prompts_per_step)
        self.sched = StalenessScheduler(self.N, int(a.max_staleness))
        self.store = storage.GroupStore(self.run_dir / "groups")
        self.total_slots = self.num_steps * self.N
        st = storage.SchedulerState.load(self.run_dir / "scheduler.json")
        from horizon.rl import prompts  # noqa: PLC0415 - numpy only

        if st is None:
            st = storage.SchedulerState(self.run_dir / "scheduler.json")
            ids = prompt_ids_for(cfg, self.total_slots)
            self.psamp = prompts.PromptSampler(ids, seed=int(cfg.seed))
        else:
            self.psamp = prompts.PromptSampler.from_state_dict(st.prompt_sampler)
        self.state = st
        self.slots: dict[int, dict] = {}
        self.events_log = self.run_dir / "events.jsonl"
        self.trainer_restarts = 0

    def _assign(self, slot: int) -> dict:
        if slot in self.state.slots:
            return self.state.slots[slot]
        ids = self.psamp.sample(1, self.sched.step_of(slot))
        if not ids:
            raise RuntimeError("prompt set exhausted (single epoch)")
        info = dict(prompt_id=ids[0], seed=int(slot))
        self.state.slots[slot] = info
        self.state.next_slot = max(self.state.next_slot, slot + 1)
        self.state.prompt_sampler = self.psamp.state_dict()
        self.state.save()
        return info

    def _request(self, slot: int, version: int) -> None:
        info = self._assign(slot)
        self.pool.submit(dict(slot=slot, prompt_id=info["prompt_id"], seed=info["seed"], min_version=int(version)))
        self.slots[slot] = dict(state="requested", requested=time.time(), prompt_id=info["prompt_id"],
                                admitted_at_version=int(version))

    def run(self) -> dict:
        a = self.cfg.async_
        weights = self.run_dir / "weights"
        t_start = time.time()
        # resume: groups already on disk are not regenerated
        ready = set(self.store.ready_slots())
        for s in ready:
            self.slots[s] = dict(state="grouped", resumed=True)
        pending = [s for s in sorted(self.state.slots) if s not in ready]   # assigned, never finished
        self.pool.start_trainer(self.cfg, str(self.run_dir), self.num_steps)
        self.pool.start_rollout_workers(self.cfg, str(self.run_dir), int(a.num_rollout_workers))
        next_slot = 0
        killed = False
        max_outstanding = int(a.num_rollout_workers) * worker_queue_depth(self.cfg)
        try:
            while True:
                v = weight_sync.latest_version(weights)
                if v is not None:
                    for s, d in self.slots.items():
                        if d["state"] == "grouped" and self.sched.step_of(s) < v:
                            d["state"], d["trained"] = "trained", time.time()
                    if v >= self.num_steps:
                        break
                if self.kill_trainer_at is not None and not killed and v is not None and v >= self.kill_trainer_at:
                    self.pool.kill_trainer()
                    killed = True
                    _jsonl(self.events_log, dict(kind="trainer_killed", version=v, time=time.time()))
                if not self.pool.trainer_alive():
                    code = self.pool.trainer_exitcode()
                    if self.trainer_restarts >= self.max_trainer_restarts:
                        raise RuntimeError(f"trainer died (exit {code}) {self.trainer_restarts} times")
                    self.trainer_restarts += 1
                    _jsonl(self.events_log, dict(kind="trainer_restart", exitcode=code, time=time.time()))
                    self.pool.start_trainer(self.cfg, str(self.run_dir), self.num_steps)
                outstanding = sum(d["state"] in ("requested", "generating", "scored") for d in self.slots.values())
                while outstanding < max_outstanding:
                    if pending:
                        s = pending[0]
                    else:
                        while next_slot in self.slots:
                            next_slot += 1
                        s = next_slot
                    if s >= self.total_slots or not self.sched.can_admit(s, v):
                        break
                    if pending:
                        pending.pop(0)
                    self._request(s, v)
                    outstanding += 1
                for e in self.pool.events(float(a.poll_s)):
                    d = self.slots.setdefault(e["slot"], {})
                    d["state"] = e["kind"]
                    d[e["kind"]] = e["time"]
                    if e["kind"] == "grouped":
                        d.update({k: e[k] for k in ("worker", "tokens", "seconds", "min_version", "max_version",
                                                    "start_version", "switches", "reward", "wrote")})
                    _jsonl(self.events_log, e)
        finally:
            self.pool.close()
        wall = time.time() - t_start
        return dict(wall_s=wall, trainer_restarts=self.trainer_restarts, slots=self.slots)


# ----------------------------------------------------------------------------- summaries
def read_trainer_log(run_dir) -> list[dict]:
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


# ----------------------------------------------------------------------------- sync baseline
def run_sync_inprocess(cfg, run_dir, num_steps: int) -> dict:
    """Single-process synchronous loop on the same env/model/optimizer: roll out the N groups of
    step t with version t, train, repeat (the baseline for experiments/rl_async.py)."""
    _setup_jax(cfg)
    import jax  # noqa: PLC0415

    from horizon.data.tokenizer import ByteTokenizer  # noqa: PLC0415
    from horizon.rl import batch as rlbatch  # noqa: PLC0415
    from horizon.rl import prompts, sampler, trainer, workers  # noqa: PLC0415

    run = pathlib.Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    N = int(cfg.rl.prompts_per_step)
    tok = ByteTokenizer(int(cfg.model.vocab_size))
    psamp = prompts.PromptSampler(prompt_ids_for(cfg, num_steps * N), seed=int(cfg.seed))
    state = trainer.init_state(initial_params(cfg), cfg)
    env = workers.ENVS[str(cfg.async_.env)](cfg)
    base_key = run_keys(cfg.seed)["rollout"]
    t0 = time.time()
    out = []
    toks = 0
    for step in range(num_steps):
        version, params = step, state.params
        reqs = [dict(slot=step * N + i, prompt_id=pid, seed=step * N + i) for i, pid in enumerate(psamp.sample(N, step))]
        recs = []
        B = batch_slots(cfg)                      # the same batching as a rollout worker
        for j in range(0, N, B):
            pol = sampler.make_policy(lambda p=params, v=version: (p, v), cfg,
                                      jax.random.fold_in(base_key, reqs[j]["seed"]),
                                      chunk_tokens=int(cfg.async_.chunk_tokens), kv_mode="keep")
            recs += [(trajs, rs) for trajs, rs, _ in env.rollouts(reqs[j:j + B], pol, tok)]
        toks += int(sum(t.num_generated_tokens for trajs, _ in recs for t in trajs))
        b = rlbatch.build_batch_from_config([r[0] for r in recs], np.asarray([r[1] for r in recs], np.float32), cfg)
        state, m = trainer.train_step(state, b, cfg=cfg)
        rec = dict(step=step + 1, time=time.time() - t0, reward_mean=float(m["reward_mean"]), tokens=toks)
        out.append(rec)
        _jsonl(run / "sync.jsonl", rec)
    span = time.time() - t0
    env.close()
    return dict(steps=num_steps, rewards=[r["reward_mean"] for r in out], times=[r["time"] for r in out],
                generated_tokens=toks, rollout_tokens_per_s=toks / span, trainer_steps_per_s=num_steps / span,
                wall_s=span)
