"""The async trainer as an actor group joined by jax.distributed (docs/SPEC.md §4.1).

`async_.trainer_processes` = n Ray actors (one per host) form one multi-controller JAX job over the
run's mesh (`c.mesh`): each gets mesh devices / n local devices (`async_setup.child_env`), the driver
asks actor 0 for a coordinator address on its node (`coordinator_address`) and starts
`processes.trainer_main` on actor i with ``(coordinator, n, i)``. Every process then reads the same
groups, builds the same batch and runs the same jitted step: `jax.device_put` of an identical host
value onto a global `NamedSharding` keeps each process's addressable shards (jax checks the values
agree across processes), orbax saves / restores the checkpoint collectively (process 0 writes its
checksum manifest, `horizon.train.checkpoint`). Only process 0 logs and publishes weights; the
published params are gathered on every process first (`host_params`: a collective).

jax stays out of import time here (the actors set their XLA flags before importing it).
"""

from __future__ import annotations

import os
import socket

Dist = tuple[str, int, int]      # (coordinator "host:port", processes, this process's index)


def coordinator_address() -> str:
    """"ip:port" on this node for a jax.distributed coordinator (a port free right now; called on
    the group's actor 0 through Ray)."""
    import ray  # noqa: PLC0415

    with socket.socket() as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    return f"{ray.util.get_node_ip_address()}:{port}"


def group_args(coordinator: str | None, n: int) -> list[Dist | None]:
    """`trainer_main`'s `dist` argument for each of the group's n processes (None: one process, no
    jax.distributed)."""
    if n == 1:
        return [None]
    if not coordinator:
        raise ValueError(f"a trainer group of {n} processes needs a coordinator address")
    return [(coordinator, int(n), i) for i in range(n)]


def join(dist: Dist | None) -> bool:
    """Join the trainer group's jax.distributed job (nothing for `dist` None). Returns whether this is
    process 0, the one that logs and publishes. CPU processes exchange collectives through gloo
    (jax 0.10's default, set explicitly so it does not depend on the jax version)."""
    if dist is None:
        return True
    import jax  # noqa: PLC0415

    coordinator, n, i = dist
    if os.environ.get("JAX_PLATFORMS", "") == "cpu":     # (asking jax would start its backend too early)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=int(n), process_id=int(i))
    return jax.process_index() == 0


def host_params(params, multiprocess: bool):
    """Params as host arrays for publishing; a group's processes each gather every shard first (a
    collective: every process must call this, in the same order)."""
    if not multiprocess:
        return params
    from jax.experimental import multihost_utils  # noqa: PLC0415

    return multihost_utils.process_allgather(params, tiled=True)


def group_publisher(apub, multiprocess: bool):
    """publish(params, version): gather on every process of a group (`host_params`), submit to the
    weight publisher `apub` on process 0 only (the others pass None)."""
    def publish(params, version: int) -> None:
        host = host_params(params, multiprocess)
        if apub is not None:
            apub.submit(host, version)
    return publish


def device_counts() -> dict[str, int]:
    """This process's and the whole job's device counts (the trainer logs them at start)."""
    import jax  # noqa: PLC0415

    return dict(local_devices=jax.local_device_count(), devices=jax.device_count())


def barrier(name: str, multiprocess: bool) -> None:
    """Wait until every process of the group reaches `name` (nothing for one process)."""
    if multiprocess:
        from jax.experimental import multihost_utils  # noqa: PLC0415

        multihost_utils.sync_global_devices(name)


def group_exitcode(codes: list[int | None]) -> int | None:
    """One exit code for the group from its processes' (None = still running): None while all run,
    else the first failure's code, 0 once every process finished cleanly. A group with a finished
    process and running others is over: the survivors hang in a collective or finish alone."""
    done = [c for c in codes if c is not None]
    if not done:
        return None
    return next((c for c in done if c != 0), 0)
