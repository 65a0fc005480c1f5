"""`RayPool`: the async runtime's trainer and rollout workers as Ray actors (docs/SPEC.md §4,
docs/SCALING.md), the one `pools.WorkerPool`.

The trainer is an actor group (`async_.trainer_processes` actors, one per host, one
`jax.distributed` job over the run's mesh, coordinator address picked by actor 0 and passed
through Ray; process 0 logs and publishes; `distributed`) and each rollout worker an actor,
running `processes.trainer_main` / `processes.rollout_worker_main` (one request queue per worker
and one event queue, all `ray.util.queue` actors pinned to the driver's node). `ray.init()`
without an address runs them on this machine, `async_.ray_address` joins a cluster,
`async_.{trainer,rollout}_resources` place them.

`ray` is imported inside the functions that use it: an optional, heavy dependency that only a
run with this pool needs.
"""

from __future__ import annotations

import os
import shutil
import signal
import time

from horizon.rl.runtime import distributed
from horizon.rl.runtime.async_setup import child_env
from horizon.rl.runtime.pools import WorkerPool, parse_resources
from horizon.rl.runtime.processes import rollout_worker_main, trainer_main


class _Runner:
    """A Ray actor that runs one of the process mains (`trainer_main`, `rollout_worker_main`) in its
    own worker process (env vars from `child_env` via runtime_env)."""

    def run(self, fn, *args):
        fn(*args)
        return 0

    def node_id(self) -> str:
        import ray  # noqa: PLC0415  (optional heavy dependency, module doc)

        return ray.get_runtime_context().get_node_id()

    def coordinator(self) -> str:
        """"ip:port" on this actor's node for a trainer group's jax.distributed coordinator."""
        return distributed.coordinator_address()


class RayPool(WorkerPool):
    """The trainer and rollout workers as Ray actors: `ray.init()` without an address runs them on
    this machine, `async_.ray_address` joins a cluster — the same code. Requests and events go
    through `ray.util.queue.Queue`s; groups and weights through the run directory (a shared
    filesystem / object-storage URL on a cluster). Each actor gets `child_env(cfg)` (XLA flags,
    threads) as its runtime env; `max_restarts=0`: the orchestrator decides restarts (the trainer
    resumes from its checkpoint, a lost worker's batch is re-requested). A Ray started here is
    sized by `async_.ray_object_store_mb` and shut down (its temp dir removed) at `close`."""

    def __init__(self, cfg):
        import ray  # noqa: PLC0415  (optional heavy dependency, module doc)
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
        from ray.util.queue import Empty  # noqa: PLC0415  (optional heavy dependency, module doc)

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
                shutil.rmtree(self._tmp, ignore_errors=True)
