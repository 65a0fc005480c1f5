"""Sandbox latency and throughput (docs/SPEC.md §5): create+exec+destroy, and parallel execs.

    .venv/bin/python benchmarks/sandbox.py [--backend docker|local] [--n 20] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from horizon.sandbox import open_sandbox
from horizon.utils import progress, provenance


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def bench_lifecycle(backend: str, image: str | None, n: int) -> dict[str, list[float]]:
    """Per-phase seconds for n sequential create -> exec('echo') -> close cycles."""
    phases: dict[str, list[float]] = {"create": [], "exec": [], "close": [], "total": []}
    for _ in progress.progress(range(n), desc=f"[{backend}] create+exec+destroy", unit="cycle"):
        t0 = time.perf_counter()
        sb = open_sandbox(backend, image)
        t1 = time.perf_counter()
        r = sb.exec("echo hi", timeout=30)
        t2 = time.perf_counter()
        sb.close()
        t3 = time.perf_counter()
        assert r.ok and r.output == "hi\n", r
        for k, v in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t3 - t0)):
            phases[k].append(v)
    return phases


def bench_concurrent(backend: str, image: str | None, sandboxes: int, execs_per: int) -> tuple[float, float]:
    """(execs/s, create-all seconds) with one thread per sandbox running `execs_per` execs."""
    with ThreadPoolExecutor(sandboxes) as ex:
        t0 = time.perf_counter()
        sbs = list(ex.map(lambda _: open_sandbox(backend, image), range(sandboxes)))
        t_create = time.perf_counter() - t0
        try:
            def work(sb):
                for i in range(execs_per):
                    r = sb.exec(f"python3 -c 'print({i} * 2)'", timeout=60)
                    assert r.ok and r.output == f"{i * 2}\n", r
            t1 = time.perf_counter()
            list(ex.map(work, sbs))
            elapsed = time.perf_counter() - t1
        finally:
            list(ex.map(lambda sb: sb.close(), sbs))
    return sandboxes * execs_per / elapsed, t_create


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backend", default="docker", choices=["docker", "local"])
    ap.add_argument("--image", default=None, help="image tag (docker); default HORIZON_BASE_IMAGE")
    ap.add_argument("--n", type=int, default=20, help="sequential create+exec+destroy cycles")
    ap.add_argument("--concurrency", type=int, default=16, help="sandboxes running at once")
    ap.add_argument("--execs", type=int, default=10, help="execs per concurrent sandbox")
    args = ap.parse_args()
    provenance.announce(config=vars(args))
    open_sandbox(args.backend, args.image).close()   # warm-up (client pool, page cache)
    phases = bench_lifecycle(args.backend, args.image, args.n)
    print(f"[{args.backend}] create+exec+destroy over n={args.n}:")
    for k, xs in phases.items():
        print(f"  {k:>6}: median {statistics.median(xs) * 1e3:8.1f} ms   p95 {_pct(xs, 0.95) * 1e3:8.1f} ms")
    rate, t_create = bench_concurrent(args.backend, args.image, args.concurrency, args.execs)
    print(f"[{args.backend}] {args.concurrency} concurrent sandboxes: created in {t_create:.2f} s, "
          f"{rate:.1f} execs/s (python3 one-liners, {args.execs} per sandbox)")


if __name__ == "__main__":
    main()
