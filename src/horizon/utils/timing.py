"""Wall-clock timing for the benchmark scripts (benchmarks/, docs/PERF.md): one way to time a call.

`timed` returns every call's seconds after untimed warm-up calls, with inputs built outside the timer;
`best_seconds` is the fastest of several calls of a jitted function over alternating inputs (a
repeat does not reuse a cached result), e.g. for a machine's matmul peak.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence


def timed(fn: Callable, warmup: int, reps: int, make_input: Callable[[int], object] | None = None,
          sync: Callable[[object], object] = lambda out: out) -> tuple[object, list[float]]:
    """(last output, seconds of each of `reps` timed calls) after `warmup` untimed ones. With
    `make_input(r)` each call gets a fresh input built outside the timer: fn(make_input(r)).
    `sync(out)` runs inside the timer (e.g. `jax.block_until_ready` for asynchronously dispatched work)."""
    if warmup < 0 or reps < 1:
        raise ValueError(f"timed: warmup must be >= 0 and reps >= 1, got warmup={warmup} reps={reps}")
    args = (lambda r: ()) if make_input is None else (lambda r: (make_input(r),))
    out = None
    for w in range(warmup):
        out = sync(fn(*args(10_000 + w)))
    times = []
    for r in range(reps):
        x = args(r)
        t0 = time.perf_counter()
        out = sync(fn(*x))
        times.append(time.perf_counter() - t0)
    return out, times


def best_seconds(fn: Callable, arg_sets: Sequence[tuple], reps: int) -> float:
    """Fastest of `reps` calls fn(*arg_sets[i % len]) after one untimed call per argument set (the
    compile), each waited for with `jax.block_until_ready`."""
    import jax  # noqa: PLC0415  (only the JAX callers need it)

    if not arg_sets:
        raise ValueError("best_seconds: no argument sets")
    for a in arg_sets:
        jax.block_until_ready(fn(*a))
    _, ts = timed(lambda r: fn(*arg_sets[r % len(arg_sets)]), 0, reps, make_input=lambda r: r,
                  sync=jax.block_until_ready)
    return min(ts)
