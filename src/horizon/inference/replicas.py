"""Data-parallel rollout engine replicas (docs/SPEC.md §4, §6): `EngineReplicas`, one `engine.Engine` per
local device behind the one engine interface, and `make_engine`, which builds what the config asks
for (``rl.sampler.engine_replicas``).

Replicas are how an engine scales over devices that each hold the model (as vLLM / SGLang do); a
model too large for one device takes a mesh instead (`engine.Engine` runs sharded over it).
Design: docs/INFERENCE.md ("Replicas").
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
from collections.abc import Callable, Hashable, Sequence

import jax
import numpy as np

from horizon.inference.config import EngineConfig, pop_engine_fields, resolve_engine_config
from horizon.inference.engine import Completion, Engine, Request, Serving
from horizon.parallel import mesh as pmesh


class EngineReplicas(Serving):
    """`n` data-parallel `Engine` replicas, one per local device, serving one request stream.

    Same interface as `Engine` (`submit`, `step`, `run`, `busy`, `release`, `stats`, `ec`). Each
    replica owns ``slots / n`` slots, its weights and its cache on its device; `step` runs every busy
    replica's round-trip in its own host thread, so the devices compute at once (on CPU, each device
    runs its kernels on its own core: docs/PERF.md). Routing keeps what reuse needs on one replica:
    an owner's requests go where its cache is (per-episode caches across turns), a context identical
    to one routed earlier goes with it (a group prefills its prompt once), anything else to the
    replica with the fewest requests (ties: the lowest index). Samples do not depend on the routing
    (per-sequence keys); `stats` sums the replicas' counters (``switches``: the most any made)."""

    def __init__(self, cfg, *, params: dict | None = None, poll: Callable[[], tuple[dict, int]] | None = None,
                 version: int = 0, engine: EngineConfig | None = None, stop_tokens: Sequence[int] | None = None,
                 **overrides):
        ec = resolve_engine_config(cfg, engine, overrides)
        n, devices = ec.replicas, jax.local_devices()
        _check_replicas(cfg, ec, len(devices))
        self.ec = ec
        one = dataclasses.replace(ec, replicas=1, slots=ec.slots // n)
        self.engines = [Engine(cfg, params=params, poll=poll, version=version, engine=one, stop_tokens=stop_tokens,
                               device=d) for d in devices[:n]]
        self.stop_tokens = self.engines[0].stop_tokens
        self._pool = concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="engine-replica")
        self._rid: dict[tuple[int, int], int] = {}            # (replica, its id there) -> request id
        self._owner: dict[Hashable, int] = {}                 # owner -> replica holding its cache
        self._ctx: collections.OrderedDict = collections.OrderedDict()   # recent context bytes -> replica
        self._next_rid = 0

    @property
    def busy(self) -> bool:
        return any(e.busy for e in self.engines)

    @property
    def stats(self) -> collections.Counter:
        out = sum((e.stats for e in self.engines), collections.Counter())
        out["switches"] = max(e.stats["switches"] for e in self.engines)
        return out

    def _route(self, req: Request, ctx: bytes) -> int:
        if req.owner is not None and req.owner in self._owner:
            return self._owner[req.owner]
        if ctx in self._ctx:
            return self._ctx[ctx]
        load = collections.Counter(r for r, _ in self._rid)      # requests submitted and not finished
        return min(range(len(self.engines)), key=lambda r: (load[r], r))

    def submit(self, req: Request) -> int:
        """Queue `req` on its replica (validated there, now); returns its request id."""
        ctx = np.asarray(req.context, np.int32).reshape(-1).tobytes()
        r = self._route(req, ctx)
        local = self.engines[r].submit(req)
        if req.owner is not None:
            self._owner[req.owner] = r
        self._ctx[ctx] = r
        self._ctx.move_to_end(ctx)
        while len(self._ctx) > self.ec.slots:
            self._ctx.popitem(last=False)
        rid = self._next_rid
        self._next_rid += 1
        self._rid[(r, local)] = rid
        return rid

    def step(self) -> list[Completion]:
        """One round-trip of every busy replica, concurrently; the requests that finished."""
        busy = [r for r, e in enumerate(self.engines) if e.busy]
        futs = {r: self._pool.submit(self.engines[r].step) for r in busy}
        out = []
        for r in busy:
            for c in futs[r].result():
                rid = self._rid.pop((r, c.request_id))
                out.append(dataclasses.replace(c, request_id=rid))
        return out

    def drop_idle(self) -> None:
        for e in self.engines:
            e.drop_idle()

    def in_flight(self) -> dict[int, tuple[list, list]]:
        """`Engine.in_flight` of every replica, under the global request ids."""
        return {self._rid[(r, local)]: v for r, e in enumerate(self.engines)
                for local, v in e.in_flight().items() if (r, local) in self._rid}

    def release(self, owner: Hashable) -> None:
        """Forget `owner`'s cache on its replica."""
        r = self._owner.pop(owner, None)
        if r is not None:
            self.engines[r].release(owner)


def _check_replicas(cfg, ec: EngineConfig, local_devices: int) -> None:
    """One-line errors for a replica count this process cannot run (`config.validate_engine` names
    the config fields before a run)."""
    n = ec.replicas
    if n < 2:
        raise ValueError(f"EngineReplicas needs engine replicas >= 2, got {n} (make_engine builds one Engine)")
    if n > local_devices:
        raise ValueError(f"engine replicas={n} need {n} local devices, this process has {local_devices} (on CPU: "
                         f"jax.config.update('jax_num_cpu_devices', {n}) before JAX starts, or "
                         f"XLA_FLAGS=--xla_force_host_platform_device_count={n})")
    if ec.slots % n:
        raise ValueError(f"engine slots={ec.slots} must be a multiple of engine replicas={n}")
    if pmesh.run_mesh(cfg) is not None:
        raise ValueError("engine replicas > 1 and a multi-device mesh do not combine: use one or the other")


def make_engine(cfg, *, engine: EngineConfig | None = None, **kwargs) -> Engine | EngineReplicas:
    """The rollout engine `cfg` asks for: one `Engine`, or `EngineReplicas` when ``engine_replicas`` > 1
    (`engine` / keyword overrides as `Engine` takes them)."""
    ec = resolve_engine_config(cfg, engine, pop_engine_fields(kwargs))
    return (Engine if ec.replicas == 1 else EngineReplicas)(cfg, engine=ec, **kwargs)
