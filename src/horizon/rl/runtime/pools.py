"""Where the async runtime's trainer and rollout workers run (docs/SPEC.md §4, docs/SCALING.md):
`WorkerPool`, the distributed-engine adapter the orchestrator drives (its one implementation is
`ray_pool.RayPool`, built by `orchestrator.make_pool`), the pool kinds, and the placement specs
of `async_` (`parse_resources`: Ray custom resources; `docker_host_for`: each node's Docker engine).
"""

from __future__ import annotations

import abc

POOLS = ("ray",)        # `async_.pool`: the kinds `orchestrator.make_pool` builds


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
