"""What JAX compiled, and how long it took (docs/PERF.md, "Studies at benchmark speed").

`CompileMeter` listens to JAX's own monitoring events (`jax.monitoring`): tracing, lowering to MLIR
and the backend compile (which includes a persistent-cache read), plus the persistent cache's hits
and misses. One meter per process (`meter()`), installed on first use; `snapshot()` is cheap, so a
driver brackets any phase with two snapshots and `Compiles.minus` gives what the phase compiled.

Compile seconds are wall seconds of the thread that compiled; horizon's drivers compile on their
main thread (tool threads never call jitted code), so a phase's compile seconds are part of its wall
time.
"""

from __future__ import annotations

import collections
import dataclasses
import threading

TRACE = "/jax/core/compile/jaxpr_trace_duration"
LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
BACKEND = "/jax/core/compile/backend_compile_duration"
CACHE_HIT = "/jax/compilation_cache/cache_hits"
CACHE_MISS = "/jax/compilation_cache/cache_misses"


@dataclasses.dataclass(frozen=True)
class Compiles:
    """Cumulative (or, after `minus`, a phase's) compile work: executables built by the backend
    (`compiles`, persistent-cache hits included), seconds tracing + lowering + compiling
    (`seconds`), persistent-cache hits and misses, and backend seconds per function name."""

    compiles: int = 0
    seconds: float = 0.0
    cache_hits: int = 0
    cache_misses: int = 0
    by_name: tuple = ()           # ((fun_name, backend seconds, count), ...) sorted by name

    def minus(self, earlier: Compiles) -> Compiles:
        before = {n: (s, c) for n, s, c in earlier.by_name}
        names = []
        for n, s, c in self.by_name:
            s0, c0 = before.get(n, (0.0, 0))
            if c > c0:
                names.append((n, s - s0, c - c0))
        return Compiles(self.compiles - earlier.compiles, self.seconds - earlier.seconds,
                        self.cache_hits - earlier.cache_hits, self.cache_misses - earlier.cache_misses, tuple(names))

    def record(self, prefix: str = "compile/") -> dict:
        """The numbers a step record carries: count, seconds, persistent-cache hits and misses."""
        return {f"{prefix}count": self.compiles, f"{prefix}s": round(self.seconds, 4),
                f"{prefix}cache_hits": self.cache_hits, f"{prefix}cache_misses": self.cache_misses}

    def top(self, n: int = 3) -> str:
        """The `n` functions that took the most backend seconds, as ``name x count (seconds)``."""
        worst = sorted(self.by_name, key=lambda t: -t[1])[:n]
        return ", ".join(f"{name} x{c} ({s:.1f}s)" for name, s, c in worst)


class CompileMeter:
    """Process-wide compile counters fed by `jax.monitoring` listeners (module docstring)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._n = 0
        self._s = 0.0
        self._hits = 0
        self._misses = 0
        self._names: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
        self._installed = False

    def install(self) -> CompileMeter:
        import jax  # noqa: PLC0415  (utils stays importable without initializing a backend)

        with self._lock:
            if self._installed:
                return self
            self._installed = True
        jax.monitoring.register_event_duration_secs_listener(self._duration)
        jax.monitoring.register_event_listener(self._event)
        return self

    def _duration(self, event: str, duration: float, **kw) -> None:
        if event not in (TRACE, LOWER, BACKEND):
            return
        with self._lock:
            self._s += float(duration)
            if event == BACKEND:
                self._n += 1
                rec = self._names[str(kw.get("fun_name", "?"))]
                rec[0] += float(duration)
                rec[1] += 1

    def _event(self, event: str, **kw) -> None:
        if event in (CACHE_HIT, CACHE_MISS):
            with self._lock:
                if event == CACHE_HIT:
                    self._hits += 1
                else:
                    self._misses += 1

    def snapshot(self) -> Compiles:
        with self._lock:
            return Compiles(self._n, self._s, self._hits, self._misses,
                            tuple(sorted((n, s, c) for n, (s, c) in self._names.items())))


_METER = CompileMeter()


def meter() -> CompileMeter:
    """The process's meter, listening from the first call on."""
    return _METER.install()


def use_persistent_cache(directory: str) -> None:
    """Every compile of this process goes through JAX's persistent compilation cache in `directory`
    ("" = off): also the small ones (the engine's buckets compile in well under JAX's default 1 s
    threshold, and a study compiles dozens), so a second process, a resumed run or another seed of a
    study reads them from disk. Drivers call it from their config (`exp.compilation_cache_dir`,
    `train.compilation_cache_dir`) before anything compiles."""
    if not directory:
        return
    import pathlib  # noqa: PLC0415

    import jax  # noqa: PLC0415

    jax.config.update("jax_compilation_cache_dir", str(pathlib.Path(directory).resolve()))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
