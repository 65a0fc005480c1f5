"""Asynchronous RL: scheduler, trainer and rollout-worker processes (SPEC §4, §4.1, fault tolerance).

The same three pieces as the synchronous loop (`horizon.rl.runtime.core`: prompt schedule, group
rollout, train step), spread over Ray actors (each actor's process gets its XLA flags from `child_env` before it imports
JAX; the orchestrator runs no JAX computation):

    orchestrator (this module, `Orchestrator.run`): assigns step t's prompts (`PromptSchedule`)
      │                        and submits its generation batches under the staleness bound
      ├─ trainer process      `trainer_main`: waits for the groups of step t, `train_groups`,
      │                        checkpoints, publishes version t+1 (weight_sync: delta chain on a shared dir)
      └─ rollout workers ×W   `rollout_worker_main`: take a generation batch, load the newest weights,
                               `rollout_groups` with in-flight weight updates (the rollout engine,
                               `policy.rollout_policy`, polling the weight source), write each group
                               to the GroupStore

All data moves through storage, never through the trainer's queues: the trainer can be
SIGKILLed at any point and restarted without corrupting anything. ``weights/`` (weight_sync) and
``groups/`` (storage.GroupStore) live under `data_root`: the run directory, or
`async_.storage_url` (an fsspec URL every node sees) + the run directory's name; ``ckpt/`` (orbax,
step level), ``scheduler.json`` (the prompt schedule) and ``trainer.jsonl`` / ``events.jsonl``
(logs) stay in the run directory. The queues carry only requests and events.

**Slots.** Every group is a *slot* with a fixed index s; it moves through
``requested -> generating -> scored -> grouped -> trained`` (timestamps kept per slot). Step t
trains on slots ``[t*N, (t+1)*N)`` (N = `rl.prompts_per_step`), in slot order, so the batch
composition is a pure function of the slot contents: a restarted trainer given the same groups
reproduces the uninterrupted run bit for bit (tests/rl/test_async.py). A step's slots are
requested in generation batches of `rl.slots_per_batch` (one queue item each), so a batch, its
sampling key and hence its samples do not depend on timing: at ``max_staleness = 0`` this runtime
trains on exactly the groups `loop.run_rl` trains on (tests/rl/test_one_loop.py).

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
"grouped", a generation batch with a slot without one is re-requested whole (same prompts,
same key; the store keeps the groups it already has).
Rollout-level checkpoints (sandbox snapshots, `storage.RolloutCheckpoints`) exist as an
optional restore path for long multi-turn rollouts; this loop does not use them (a
killed worker's slot is re-requested from scratch).

**Distributed engine: Ray** (issue 23). `WorkerPool` is the adapter and `RayPool` the one
implementation: the trainer is an actor group (`async_.trainer_processes` actors, one per host, one
`jax.distributed` job over the run's mesh, coordinator address picked by actor 0 and passed
through Ray; process 0 logs and publishes; `horizon.rl.runtime.distributed`) and each rollout
worker an actor, running `trainer_main` / `rollout_worker_main` (one request queue per worker and
one event queue, all `ray.util.queue` actors pinned to the driver's node); `ray.init()` without an
address runs them on this machine, `async_.ray_address` joins a cluster,
`async_.{trainer,rollout}_resources` place them. The orchestrator replaces a lost trainer group
(one lost process = the group; it resumes from its checkpoint) and lost rollout workers (the
unfinished slots queued on them go to the replacement); on a cluster `async_.storage_url` (or a
shared run directory) is what every node sees (docs/SCALING.md).

experiments/rl_async.py's synchronous baseline is `loop.run_rl` itself, run in a child process
with the same XLA flags and threads as these (`run_child`, a spawned local process).
"""

from __future__ import annotations

import abc
import collections
import json
import multiprocessing as mp
import os
import pathlib
import signal
import time
from collections.abc import Callable

import numpy as np

from horizon.rl.runtime import core as runtime, distributed, storage, weight_sync
from horizon.utils.files import url_dir

def numpy_init(mcfg, seed: int) -> dict:
    """`horizon.model.params.numpy_init`, imported lazily: this module keeps jax out of import time
    so worker processes can set their XLA flags first."""
    from horizon.model.params import numpy_init as init  # noqa: PLC0415

    return init(mcfg, seed)


SLOT_STATES = ("requested", "generating", "scored", "grouped", "trained")
_OUTSTANDING = ("requested", "generating", "scored")


# ----------------------------------------------------------------------------- config helpers
def worker_queue_depth(cfg) -> int:
    """Outstanding slot requests per worker: `async_.queue_depth`, 0 = `rl.prompts_per_step`
    (at least one generation batch, `runtime.batch_slots`)."""
    n = int(cfg.async_.queue_depth)
    return max(n if n > 0 else int(cfg.rl.prompts_per_step), runtime.batch_slots(cfg))


def initial_params(cfg):
    """The policy the run starts from: `async_.init_from` (a finished SFT checkpoint dir, e.g.
    runs/rl_tiny/sft: the same warm start as experiments/rl.py) or, if empty, `numpy_init`."""
    d = str(cfg.async_.get("init_from", "") or "")
    if not d:
        return numpy_init(cfg.model, int(cfg.seed))
    from horizon.rl.runtime.loop import load_sft_params  # noqa: PLC0415

    return load_sft_params(cfg, d)


def mesh_devices(cfg) -> int:
    """Devices of the run's mesh (`c.mesh`)."""
    import math  # noqa: PLC0415

    from horizon.parallel.mesh import mesh_sizes  # noqa: PLC0415

    return math.prod(mesh_sizes(cfg.mesh).values())


def child_env(cfg, processes: int = 1) -> dict[str, str]:
    """Environment for JAX child processes: CPU, the run's mesh devices (`c.mesh`: the trainer and
    each rollout worker run their steps on it) split over `processes` JAX processes (a trainer
    group joined by jax.distributed), few threads (shared machine)."""
    n = int(cfg.async_.threads_per_process)
    flags = f"--xla_force_host_platform_device_count={mesh_devices(cfg) // int(processes)}"
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


def data_root(cfg, run_dir) -> str:
    """Where a loop's `groups/` and `weights/` live: the run directory, or with `async_.storage_url`
    (an fsspec URL every node sees, e.g. s3://bucket/runs) `<storage_url>/<run dir name>`.
    Checkpoints (orbax, its own path handling) and logs stay in the run directory."""
    url = str(cfg.async_.get("storage_url", "") or "").rstrip("/")
    return str(run_dir) if not url else f"{url}/{pathlib.Path(run_dir).name}"


def make_publisher(cfg, directory) -> weight_sync.WeightPublisher:
    a = cfg.async_
    return weight_sync.WeightPublisher(directory, dtype=str(a.publish_dtype), codec=str(a.codec),
                                       level=int(a.codec_level), full_every=int(a.full_every),
                                       keep_fulls=int(a.keep_fulls), shard_elems=int(a.shard_elems),
                                       num_threads=int(a.publish_threads))


def _jsonl(path: pathlib.Path | None, rec: dict) -> None:
    if path is None:            # a trainer group's processes other than 0 do not log
        return
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
def trainer_main(cfg, run_dir: str, num_steps: int, dist: tuple[str, int, int] | None = None) -> None:
    """Trainer process: consume groups of step t (slot order), train, checkpoint, publish t+1.
    With `dist` = (coordinator, n, i) it is process i of a trainer group (`distributed.join`): every
    process reads the same groups and runs the same step on the global mesh; process 0 logs and
    publishes, and no process returns before it has published the last version."""
    main = distributed.join(dist)
    _setup_jax(cfg)
    a = cfg.async_
    run = pathlib.Path(run_dir)
    N = int(cfg.rl.prompts_per_step)
    data = data_root(cfg, run)
    store = storage.GroupStore(f"{data}/groups")
    log = run / "trainer.jsonl" if main else None
    state, ckpt, meta = runtime.resume_rl_state(initial_params(cfg), cfg, run / "ckpt")
    start = 0 if meta is None else int(meta["step"])
    apub = None
    if main:
        pub = make_publisher(cfg, f"{data}/weights")
        pub.resume()
        apub = weight_sync.AsyncPublisher(pub)
    publish = distributed.group_publisher(apub, dist is not None)
    publish(state.params, start)          # version `start` (re-publish = bit-identity check)
    if apub is not None:
        apub.wait()
    _jsonl(log, dict(event="start", pid=os.getpid(), step=start, restored=meta is not None, time=time.time(),
                     processes=1 if dist is None else int(dist[1]), **distributed.device_counts()))
    for step in range(start, num_steps):
        slots = range(step * N, (step + 1) * N)
        t0 = time.time()
        while not all(store.has(s) for s in slots):
            time.sleep(float(a.poll_s))
        t_wait = time.time() - t0
        recs = [store.get(s) for s in slots]
        state, m, _ = runtime.train_groups(state, recs, cfg)
        t_train = time.time() - t0 - t_wait
        ckpt.save(step + 1, state, {"step": step + 1}, force=step + 1 == num_steps)
        if (step + 1) % int(a.publish_every) == 0 or step + 1 == num_steps:
            publish(state.params, step + 1)
        stats = list(apub.stats) if apub is not None else []
        _jsonl(log, dict(event="step", step=step + 1, slots=list(slots), pid=os.getpid(), time=time.time(),
                         wait_s=t_wait, train_s=t_train, reward_mean=m["reward_mean"],
                         staleness=token_staleness(recs, step), group_min_versions=[r.min_version for r in recs],
                         generated_tokens=int(sum(r.generated_tokens for r in recs)),
                         publish=[dict(version=s.version, kind=s.kind, ratio=s.ratio, bytes=s.file_bytes,
                                       seconds=s.seconds) for s in stats[-2:]],
                         **{k: m[k] for k in m if k in ("loss", "grad_norm", "entropy", "sampler_logprob_diff")
                            or k.startswith(("pack/", "infra/"))}))
    if apub is not None:
        apub.close()
    ckpt.close()
    distributed.barrier("trainer done", dist is not None)    # the last version is out before any exits
    _jsonl(log, dict(event="done", pid=os.getpid(), step=num_steps, time=time.time()))


# ----------------------------------------------------------------------------- rollout process
def rollout_worker_main(worker_id: int, cfg, run_dir: str, requests, events) -> None:
    """Rollout worker: a generation batch of slot requests -> newest weights -> `runtime.rollout_groups`
    (in-flight updates) -> GroupStore."""
    _setup_jax(cfg)
    import jax  # noqa: PLC0415

    from horizon.data.tokenizer import tokenizer_from_config  # noqa: PLC0415
    from horizon.rl.runtime import workers  # noqa: PLC0415

    a = cfg.async_
    run = pathlib.Path(run_dir)
    if host := docker_host_for(a.get("docker_hosts", ""), _node_ip()):
        os.environ["DOCKER_HOST"] = host      # read when this process makes its Docker client
    tok = tokenizer_from_config(cfg)
    template = jax.eval_shape(lambda: numpy_init(cfg.model, 0))
    data = data_root(cfg, run)
    source = workers.WeightSource(f"{data}/weights", template, min_interval_s=float(a.weight_poll_interval_s))
    store = storage.GroupStore(f"{data}/groups")
    env = workers.ENVS[runtime.env_name(cfg)](cfg)       # this worker's environment (its pooled sandboxes)
    name = f"w{worker_id}"
    try:
        while (reqs := requests.get()) is not None:      # one item = one generation batch (runtime docstring)
            for r in reqs:
                events.put(dict(kind="generating", slot=int(r["slot"]), worker=name, time=time.time()))
            source.wait_for(max(int(r["min_version"]) for r in reqs), float(a.weights_timeout_s))
            recs, info = runtime.rollout_groups(env, reqs, source.poll, cfg, tok, worker=name)
            for rec in recs:
                events.put(dict(kind="scored", slot=rec.slot, worker=name, time=time.time()))
                wrote = store.put(rec)
                events.put(dict(kind="grouped", slot=rec.slot, worker=name, time=time.time(), wrote=wrote,
                                tokens=rec.generated_tokens, seconds=rec.seconds, min_version=rec.min_version,
                                max_version=rec.max_version, start_version=rec.start_version,
                                switches=info["switches"], reward=float(np.mean(rec.rewards)),
                                success=float(np.mean([i.get("verifier", i.get("reward", 0.0)) for i in rec.infos]))))
    finally:
        env.close()


def _node_ip() -> str:
    """This process's node address as Ray names it (`async_.docker_hosts` keys)."""
    import ray  # noqa: PLC0415

    return ray.util.get_node_ip_address()


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
        """Kill (a process of) the trainer (fault injection)."""

    @abc.abstractmethod
    def start_rollout_workers(self, cfg, run_dir: str, n: int) -> None: ...

    @abc.abstractmethod
    def workers_alive(self) -> list[bool]: ...

    @abc.abstractmethod
    def restart_worker(self, i: int, cfg, run_dir: str) -> None:
        """Replace rollout worker `i` (lost: its node died, or it was killed)."""

    @abc.abstractmethod
    def kill_worker(self, i: int) -> None:
        """Kill rollout worker `i` (fault injection)."""

    @abc.abstractmethod
    def submit(self, request: list[dict], worker: int) -> None:
        """Queue one generation batch for rollout worker `worker` (each worker has its own queue: a
        batch is never taken by a worker that is already dead)."""

    @abc.abstractmethod
    def events(self, timeout: float) -> list[dict]:
        """Worker events (dicts with kind/slot/worker/time) received within `timeout` seconds."""

    @abc.abstractmethod
    def close(self) -> None: ...


def spawn(ctx, env: dict[str, str], target, args):
    """Start `target(*args)` in a daemon child of `ctx` with `env` added to its environment."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)       # spawn children inherit the parent's environment
    try:
        p = ctx.Process(target=target, args=args, daemon=True)
        p.start()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return p


def run_child(cfg, target, *args) -> None:
    """Run `target(*args)` in a spawned child with the XLA flags and threads of the runtime's
    processes (`child_env`) and wait for it; raises if it fails."""
    p = spawn(mp.get_context("spawn"), child_env(cfg), target, args)
    p.join()
    if p.exitcode != 0:
        raise RuntimeError(f"{getattr(target, '__name__', target)} exited with code {p.exitcode}")


def sync_main(cfg, run_dir: str) -> None:
    """experiments/rl_async.py's synchronous baseline: `loop.run_rl` (the one loop) on the
    runtime's environment from `initial_params(cfg)`, `exp.steps` steps, logging to
    run_dir/metrics.jsonl, checkpointing to run_dir/ckpt and keeping its groups in run_dir/groups
    (the async layout); run it with `run_child`."""
    _setup_jax(cfg)
    from horizon.data.tokenizer import tokenizer_from_config  # noqa: PLC0415
    from horizon.rl.runtime import loop, workers  # noqa: PLC0415

    run = pathlib.Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    env = workers.ENVS[runtime.env_name(cfg)](cfg)
    log = loop.JsonlLog(run / "metrics.jsonl")
    try:
        loop.run_rl(initial_params(cfg), env, cfg, tokenizer_from_config(cfg), run, log,
                    store=storage.GroupStore(f"{data_root(cfg, run)}/groups"))
    finally:
        env.close()
        log.close()


def parse_resources(spec: str) -> dict[str, float]:
    """`"trainer=1,gpu_host=0.5"` -> {"trainer": 1.0, "gpu_host": 0.5} (Ray custom resources; "" -> {})."""
    out = {}
    for part in filter(None, (x.strip() for x in str(spec or "").split(","))):
        name, eq, amount = part.partition("=")
        try:
            out[name.strip()] = float(amount)
        except ValueError:
            raise ValueError(f"resource spec {spec!r}: expected 'name=amount,...', got {part!r}") from None
        if not eq or not name.strip() or out[name.strip()] <= 0:
            raise ValueError(f"resource spec {spec!r}: expected 'name=amount,...' with amount > 0, got {part!r}")
    return out


def docker_host_for(spec: str, node_ip: str) -> str | None:
    """The Docker engine a rollout worker on `node_ip` uses, from `async_.docker_hosts`
    ("IP=URL,...,*=URL"; "" or no match = None: docker-py's default, DOCKER_HOST or the local socket)."""
    table = {}
    for part in filter(None, (x.strip() for x in str(spec or "").split(","))):
        ip, eq, url = part.partition("=")
        if not eq or not ip.strip() or "://" not in url:
            raise ValueError(f"docker hosts {spec!r}: expected 'IP=URL,...' (URL like tcp://host:2375 or "
                             f"unix:///var/run/docker.sock; IP '*' = every other node), got {part!r}")
        table[ip.strip()] = url.strip()
    return table.get(node_ip, table.get("*"))


class _Runner:
    """A Ray actor that runs one of this module's process mains (`trainer_main`,
    `rollout_worker_main`) in its own worker process (env vars from `child_env` via runtime_env)."""

    def run(self, fn, *args):
        fn(*args)
        return 0

    def node_id(self) -> str:
        import ray  # noqa: PLC0415

        return ray.get_runtime_context().get_node_id()

    def coordinator(self) -> str:
        """"ip:port" on this actor's node for a trainer group's jax.distributed coordinator."""
        return distributed.coordinator_address()


class RayPool(WorkerPool):
    """The trainer and rollout workers as Ray actors (issue 23): `ray.init()` without an address runs
    them on this machine, `async_.ray_address` joins a cluster — the same code. Requests and events
    go through `ray.util.queue.Queue`s; groups and weights through the run directory (a shared
    filesystem / object-storage URL on a cluster). Each actor gets `child_env(cfg)` (XLA flags,
    threads) as its runtime env; `max_restarts=0`: the orchestrator decides restarts (the trainer
    resumes from its checkpoint, a lost worker's batch is re-requested). A Ray started here is
    sized by `async_.ray_object_store_mb` and shut down (its temp dir removed) at `close`."""

    def __init__(self, cfg):
        import ray  # noqa: PLC0415
        from ray.util.queue import Queue  # noqa: PLC0415
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: PLC0415

        a = cfg.async_
        self.ray, self.env = ray, child_env(cfg)
        self._tmp = None
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            addr = str(a.get("ray_address", "") or "") or None
            kw = {}
            if addr is None:
                self._tmp = f"/tmp/horizon_ray_{os.getpid()}"    # short: Ray's unix sockets live under it
                kw = dict(num_cpus=os.cpu_count(), object_store_memory=int(a.ray_object_store_mb) << 20,
                          _temp_dir=self._tmp)
            os.environ.setdefault("RAY_memory_usage_threshold", str(float(a.ray_memory_threshold)))
            ray.init(address=addr, include_dashboard=False, log_to_driver=True, configure_logging=False, **kw)
        self._actor_cls = ray.remote(num_cpus=0, max_restarts=0)(_Runner)
        # queues live on the driver's node: a lost worker node must not take the run's queues with it
        here = {"num_cpus": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(
            ray.get_runtime_context().get_node_id(), soft=False)}
        self._queue = lambda: Queue(actor_options=here)
        self.requests: list = []          # one request queue per rollout worker
        self.event_q = self._queue()
        self.trainers: list = []           # the trainer group's actors (process i = actor i)
        self._trainer_refs: list = []
        self.workers: list = []
        self._worker_refs: list = []
        self._trainer_code: int | None = None

    def _actor(self, env: dict[str, str], resources: str = ""):
        # max_concurrency 2: `node_id` answers while `run` runs
        return self._actor_cls.options(runtime_env={"env_vars": dict(env)}, resources=parse_resources(resources),
                                       scheduling_strategy="SPREAD", max_concurrency=2).remote()

    def _start(self, fn, *args, resources: str = ""):
        actor = self._actor(self.env, resources)
        return actor, actor.run.remote(fn, *args)

    def _done(self, ref) -> bool:
        return bool(self.ray.wait([ref], timeout=0)[0])

    def start_trainer(self, cfg, run_dir, num_steps):
        """The trainer group: `async_.trainer_processes` actors (one per host), joined by
        jax.distributed through a coordinator address that actor 0 picks on its node. A previous
        group (a broken one whose survivors hang in a collective) is killed first."""
        self._kill_trainers()
        self._trainer_code = None
        n = int(cfg.async_.trainer_processes)
        env = child_env(cfg, n)
        actors = [self._actor(env, cfg.async_.trainer_resources) for _ in range(n)]
        wait = float(cfg.async_.trainer_start_timeout_s)
        coord = self.ray.get(actors[0].coordinator.remote(), timeout=wait) if n > 1 else None
        self.trainers = actors
        self._trainer_refs = [x.run.remote(trainer_main, cfg, run_dir, num_steps, d)
                              for x, d in zip(actors, distributed.group_args(coord, n))]

    def trainer_alive(self):
        """Every process of the group runs. One that stopped makes the whole group dead: after a
        failure the survivors (hanging in a collective) are killed (`_reap_trainers`)."""
        if any(self._done(r) for r in self._trainer_refs):
            self._reap_trainers()
            return False
        return bool(self._trainer_refs)

    def trainer_exitcode(self):
        """None while every process runs; else the group's first failure's code (0 once all finished
        cleanly; `distributed.group_exitcode`)."""
        code = distributed.group_exitcode([self._exitcode(r) if self._done(r) else None
                                           for r in self._trainer_refs])
        if code and self._trainer_code is None:
            self._trainer_code = code          # the first failure, not the kills that follow it
        return self._trainer_code if self._trainer_code is not None else code

    def _reap_trainers(self) -> None:
        """After a process of the group failed, kill the ones still running (they would wait forever
        for the lost one in a collective)."""
        if self.trainer_exitcode():
            for x, r in zip(self.trainers, self._trainer_refs):
                if not self._done(r):
                    self.ray.kill(x, no_restart=True)

    def _exitcode(self, ref) -> int:
        try:
            self.ray.get(ref)
            return 0
        except self.ray.exceptions.RayActorError:
            return -int(signal.SIGKILL)      # the actor's process died
        except self.ray.exceptions.RayTaskError:
            return 1                          # trainer_main raised

    def kill_trainer(self):
        """Kill the group's last process (fault injection: the group is then dead, `trainer_alive`)."""
        if self.trainers:
            self.ray.kill(self.trainers[-1], no_restart=True)
            self.ray.wait([self._trainer_refs[-1]], timeout=30)

    def _kill_trainers(self):
        for x in self.trainers:
            self.ray.kill(x, no_restart=True)
        self.trainers, self._trainer_refs = [], []

    def wait_trainer(self, timeout: float) -> int | None:
        """Block until the trainer group finishes, or fails (the survivors are then killed), or
        `timeout`; its exit code (None if still running)."""
        deadline = time.time() + timeout
        while pending := [r for r in self._trainer_refs if not self._done(r)]:
            if time.time() >= deadline:
                return None
            self.ray.wait(pending, num_returns=1, timeout=deadline - time.time())
            self._reap_trainers()
        return self.trainer_exitcode()

    def start_rollout_workers(self, cfg, run_dir, n):
        for i in range(n):
            self.requests.append(self._queue())
            actor, ref = self._start(rollout_worker_main, i, cfg, run_dir, self.requests[i], self.event_q,
                                     resources=cfg.async_.rollout_resources)
            self.workers.append(actor)
            self._worker_refs.append(ref)

    def restart_worker(self, i, cfg, run_dir):
        self.ray.kill(self.workers[i], no_restart=True)
        # a fresh queue: a get() the dead worker left pending would swallow the next batch
        self.requests[i] = self._queue()
        self.workers[i], self._worker_refs[i] = self._start(rollout_worker_main, i, cfg, run_dir, self.requests[i],
                                                            self.event_q, resources=cfg.async_.rollout_resources)

    def kill_worker(self, i):
        self.ray.kill(self.workers[i], no_restart=True)
        self.ray.wait([self._worker_refs[i]], timeout=30)

    def submit(self, request, worker):
        self.requests[worker].put(request)

    def events(self, timeout):
        from ray.util.queue import Empty  # noqa: PLC0415

        out = []
        try:
            out.append(self.event_q.get(timeout=timeout))
            while True:
                out.append(self.event_q.get_nowait())
        except Empty:
            pass
        return out

    def workers_alive(self) -> list[bool]:
        return [not self._done(r) for r in self._worker_refs]

    def worker_nodes(self, timeout: float = 60.0) -> list[str]:
        """The Ray node id each rollout worker runs on."""
        return self.ray.get([w.node_id.remote() for w in self.workers], timeout=timeout)

    def close(self):
        for q in self.requests:
            q.put(None)
        if self._worker_refs:
            self.ray.wait(self._worker_refs, num_returns=len(self._worker_refs), timeout=30)
        for w in self.workers:
            self.ray.kill(w, no_restart=True)
        if self.trainers:
            if self.trainer_alive():
                self.ray.wait(self._trainer_refs, num_returns=len(self._trainer_refs), timeout=60)
            self._kill_trainers()
        if self._owns_ray:
            self.ray.shutdown()
            if self._tmp:
                import shutil  # noqa: PLC0415

                shutil.rmtree(self._tmp, ignore_errors=True)


POOLS = ("ray",)


def make_pool(kind: str, cfg) -> WorkerPool:
    if kind == "ray":
        return RayPool(cfg)
    raise ValueError(f"unknown pool kind {kind!r} ({' | '.join(POOLS)})")


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
        from horizon.rl.runtime.checks import validate_async  # noqa: PLC0415  (checks imports the rl layer)

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
        load = collections.Counter(d.get("worker") for d in self.slots.values() if d.get("state") in _OUTSTANDING)
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
                if (self.kill_worker_at is not None and v is not None and v >= self.kill_worker_at
                        and any(d.get("state") == "generating" and d.get("worker") == "w0" for d in self.slots.values())):
                    self.kill_worker_at = None
                    self.pool.kill_worker(0)
                    _jsonl(self.events_log, dict(kind="worker_killed", worker="w0", version=v, time=time.time()))
                if self.fault_hook is not None:
                    self.fault_hook(self, v)
                self._replace_lost_workers()
                outstanding = sum(d["state"] in _OUTSTANDING for d in self.slots.values())
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
                for e in self.pool.events(float(a.poll_s)):
                    self._on_event(e)
        finally:
            self.pool.close()
        wall = time.time() - t_start
        return dict(wall_s=wall, trainer_restarts=self.trainer_restarts, worker_restarts=self.worker_restarts,
                    slots=self.slots)

    def _on_event(self, e: dict) -> None:
        """A worker event: the slot's state moves on (a finished slot stays finished when a re-requested
        batch reports it again) and the event goes to events.jsonl."""
        _jsonl(self.events_log, e)
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
                self.slots.get(r["slot"], {}).get("state") in _OUTSTANDING for r in self.batches[f]))
            lost = [r["slot"] for f in firsts for r in self.batches[f]
                    if self.slots.get(r["slot"], {}).get("state") in _OUTSTANDING]
            _jsonl(self.events_log, dict(kind="worker_restart", worker=f"w{i}", lost_slots=lost, time=time.time()))
            self.pool.restart_worker(i, self.cfg, str(self.run_dir))
            for f in firsts:
                self.pool.submit([r for r in self.batches[f] if r["slot"] in lost], i)
            for s in lost:
                self.slots[s].update(state="requested", requested_again=time.time())


# ----------------------------------------------------------------------------- summaries
def summarize_sync(run_dir, wall_s: float | None = None) -> dict:
    """`summarize`'s numbers for a `sync_main` run (its metrics.jsonl)."""
    p = pathlib.Path(run_dir) / "metrics.jsonl"
    recs = [r for r in map(json.loads, p.read_text().splitlines()) if r.get("phase") == "rl"]
    span = recs[-1]["time_s"] if recs else None
    toks = int(sum(r["gen_tokens"] for r in recs))
    return dict(steps=len(recs), rewards=[r["reward_mean"] for r in recs], times=[r["time_s"] for r in recs],
                generated_tokens=toks, rollout_tokens_per_s=toks / span if span else None,
                trainer_steps_per_s=len(recs) / span if span else None, wall_s=wall_s if wall_s is not None else span)


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
