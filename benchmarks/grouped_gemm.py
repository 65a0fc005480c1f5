"""The MoE layer's expert GEMMs: the project's grouped GEMM ("block") vs `jax.lax.ragged_dot` (docs/SPEC.md §1.2).

One MoE layer's routed-expert compute, `h = silu(x Wg) * (x Wu); y = h Wd` over the T*k (token, expert)
rows sorted by expert, each GEMM a grouped GEMM (`horizon.quant.grouped.grouped_matmul(impl=...)`).
Routing is uniform random top-k (each token picks k distinct experts), so groups are ~T*k/E rows.
Per implementation it prints the compiled FLOPs (`cost_analysis()`, under `grouped.count_flops()` so the
block tile loop is counted tile by tile; the forward only unless `--count-backward`) against the analytic
2*rows*d*f per GEMM, and the median wall time of the forward and of forward+backward (grads of x and the \
three weights); an implementation whose
compiled FLOPs exceed `--max-flops-ratio` x the analytic count (XLA expanding ragged_dot into every
group) is reported and not timed. `--json` appends one record per implementation. An implementation
``block:loop`` / ``block:batched`` forces the block GEMM's tile schedule (`grouped.BATCHED_MAX_BYTES`:
a loop over tiles, or one batched product over gathered weights); plain ``block`` runs what this
backend's limit picks.

    JAX_PLATFORMS=cuda python3 benchmarks/grouped_gemm.py            # 16k tokens, 256 experts top-8, d 7168, f 2048
    .venv/bin/python benchmarks/grouped_gemm.py --tokens 512 --experts 16 --topk 2 --d 256 --f 128 --dtype float32
    .venv/bin/python benchmarks/grouped_gemm.py --tokens 32 --experts 8 --topk 2 --d 64 --f 32 --dtype float32 \
        --impls block:loop,block:batched      # a decode step's MoE on configs/tiny.py
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import statistics
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))

from horizon.quant import grouped  # noqa: E402
from horizon.utils import progress, provenance, timing  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--d", type=int, default=7168)
    p.add_argument("--f", type=int, default=2048)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--impls", default="block,ragged_dot")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--max-flops-ratio", type=float, default=4.0)
    p.add_argument("--no-backward", action="store_true")
    p.add_argument("--count-backward", action="store_true",
                   help="also count fwd+bwd FLOPs (slow to compile at full size: the count gathers weights per tile)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="", help="append one JSON line per implementation to this file")
    return p.parse_args(argv)


def problem(args):
    """Expert-sorted rows x [T*k, d], weights [E, d, f] x2 and [E, f, d], group sizes [E]."""
    kr, kx, kg, ku, kd = jax.random.split(jax.random.key(args.seed), 5)
    scores = jax.random.uniform(kr, (args.tokens, args.experts))
    idx = jax.lax.top_k(scores, args.topk)[1]                    # k distinct experts per token
    group_sizes = jnp.bincount(idx.reshape(-1), length=args.experts).astype(jnp.int32)
    dt = jnp.dtype(args.dtype)
    rows = args.tokens * args.topk
    x = jax.random.normal(kx, (rows, args.d), dt)
    std = args.d ** -0.5
    w = {"gate": (jax.random.normal(kg, (args.experts, args.d, args.f)) * std).astype(dt),
         "up": (jax.random.normal(ku, (args.experts, args.d, args.f)) * std).astype(dt),
         "down": (jax.random.normal(kd, (args.experts, args.f, args.d)) * args.f ** -0.5).astype(dt)}
    return x, w, group_sizes


def expert_mlp(impl: str):
    def f(x, w, gs):
        mm = lambda a, b: grouped.grouped_matmul(a, b, gs, impl=impl)  # noqa: E731
        return mm(jax.nn.silu(mm(x, w["gate"])) * mm(x, w["up"]), w["down"])
    return f


def fwd_bwd(impl: str):
    f = expert_mlp(impl)

    def g(x, w, gs):
        loss = lambda x, w: jnp.sum(f(x, w, gs).astype(jnp.float32) ** 2) * 1e-6  # noqa: E731
        return jax.grad(loss, argnums=(0, 1))(x, w)
    return g


def compiled_flops(fn, *args) -> float:
    """FLOPs of `fn` traced under `count_flops()`. A fresh wrapper, so this trace (the tile loop as one
    batched product) never lands in the jit cache that the timed `jax.jit(fn)` uses."""
    with grouped.count_flops():
        return float(jax.jit(lambda *a: fn(*a)).lower(*args).compile().cost_analysis()["flops"])


@contextlib.contextmanager
def schedule(name: str):
    """The block GEMM's tile schedule for "loop" / "batched" (`grouped.BATCHED_MAX_BYTES`); "" keeps it."""
    backend, table = jax.default_backend(), grouped.BATCHED_MAX_BYTES
    old = table.get(backend)
    if name:
        table[backend] = {"loop": 0, "batched": 1 << 62}[name]
    try:
        yield
    finally:
        table.pop(backend, None)
        if old is not None:
            table[backend] = old


def median_time(fn, *args, iters: int, warmup: int) -> tuple[float, float]:
    """(median seconds of a call, seconds of the first call = compile + run), by `timing.timed`."""
    sync = jax.block_until_ready
    _, (first,) = timing.timed(lambda: fn(*args), 0, 1, sync=sync)
    _, ts = timing.timed(lambda: fn(*args), warmup - 1, iters, sync=sync)
    return statistics.median(ts), first


def main(argv=None) -> int:
    args = parse_args(argv)
    prov = provenance.announce(config=vars(args), seeds=args.seed)
    x, w, gs = problem(args)
    rows = x.shape[0]
    ana_fwd = 3 * 2.0 * rows * args.d * args.f
    ana = {"fwd": ana_fwd, "fwd+bwd": 3 * ana_fwd}
    print(f"device {jax.devices()[0].device_kind}; {args.tokens} tokens x top-{args.topk} = {rows} rows over "
          f"{args.experts} experts (sizes {int(gs.min())}..{int(gs.max())}), d {args.d}, f {args.f}, {args.dtype}; "
          f"analytic FLOPs fwd {ana_fwd:.3g}, fwd+bwd {ana['fwd+bwd']:.3g}", flush=True)
    ref = None
    # Every implementation's forward first, then the backward passes: the must-have comparison comes
    # before the slowest compiles (on an H200 the block fwd+bwd FLOP count alone outlived a 90 s cap).
    order = [("fwd", impl) for impl in args.impls.split(",")]
    order += [] if args.no_backward else [("fwd+bwd", impl) for impl in args.impls.split(",")]
    for name, spec in progress.progress(order, desc="grouped GEMM passes", unit="pass"):
        impl, _, sched = spec.partition(":")
        if sched not in ("", "loop", "batched"):
            raise SystemExit(f"--impls: {spec!r}: the schedule after ':' is loop or batched")
        with schedule(sched):
            rec, out = run_one(args, name, impl, spec, x, w, gs, ana, ref)
        ref = out if ref is None else ref
        if args.json:
            with open(args.json, "a") as fh:
                fh.write(json.dumps(prov.stamp(rec)) + "\n")
    return 0


def run_one(args, name, impl, spec, x, w, gs, ana, ref):
    """Count and time one (pass, implementation) against `ref` (the first forward's output, or None):
    (the record, this forward's float32 output or None)."""
    fn = expert_mlp(impl) if name == "fwd" else fwd_bwd(impl)
    rec = {"impl": spec, "pass": name, "analytic_flops": ana[name], "tokens": args.tokens,
           "experts": args.experts, "topk": args.topk, "d": args.d, "f": args.f, "dtype": args.dtype}
    comp, out = float("nan"), None
    if name == "fwd" or args.count_backward:
        try:
            comp = compiled_flops(fn, x, w, gs)
        except Exception as e:  # noqa: BLE001 - e.g. the counting variant's gathered weights too large
            progress.say(f"{spec:>13} {name:>7}: FLOP count failed: {type(e).__name__}: {str(e)[:200]}")
    rec["compiled_flops"] = comp
    line = f"{spec:>13} {name:>7}: compiled FLOPs {comp:.3g} = {comp / ana[name]:.2f}x analytic"
    if comp > args.max_flops_ratio * ana[name]:
        rec["skipped"] = f"compiled FLOPs {comp / ana[name]:.1f}x analytic > {args.max_flops_ratio}"
        progress.say(line + "  -> not timed (" + rec["skipped"] + ")")
    else:
        jf = jax.jit(fn)
        t, first = median_time(jf, x, w, gs, iters=args.iters, warmup=args.warmup)
        if name == "fwd":  # same answer as the first implementation (bf16 rounding of 3 GEMMs)
            out = jf(x, w, gs).astype(jnp.float32)
            ref = out if ref is None else ref
            rec["max_rel_diff_vs_first"] = float(jnp.max(jnp.abs(out - ref)) / jnp.max(jnp.abs(ref)))
        rec.update(seconds=t, first_call_s=first, tflops=ana[name] / t / 1e12)
        diff = f"  max rel diff vs first impl {rec['max_rel_diff_vs_first']:.1e}" if name == "fwd" else ""
        progress.say(line + f"  {t * 1e3:9.2f} ms  {ana[name] / t / 1e12:7.1f} TFLOP/s (analytic)  "
                     f"compile + first call {first:.1f} s" + diff)
    return rec, out


if __name__ == "__main__":
    raise SystemExit(main())
