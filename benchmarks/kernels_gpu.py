"""GPU benchmark of the block-scaled Pallas kernels vs XLA dots (SPEC §3).

Prepared for a future H100/H200 session; cannot run here (no GPU). `--dry-run`
parses arguments, builds the size list and quantizes a tiny problem on CPU.
For each size: correctness of the Pallas MXFP8 kernel vs the pure-JAX reference,
then median wall time of (a) the Pallas kernel, (b) jnp.dot in fp8 (e4m3 x e4m3 ->
f32, cuBLASLt via XLA, no block scales: a speed-of-light baseline), (c) jnp.dot in
bf16; prints TFLOP/s and the ratio kernel / baseline.
Grouped (MoE) kernel (`--groups G`, default 8; 0 skips): T = N = K = size tokens split into G
random groups (one of them empty), Pallas grouped MXFP8 vs `jax.lax.ragged_dot` in bf16.
On a Blackwell GPU (sm_100) the tcgen05 MXFP8 / NVFP4 kernels are checked and timed instead
of the Hopper ones (they have never run anywhere else: check the error column first).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

DEFAULT_SIZES = "1024,2048,4096,8192"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="comma list of cube sizes M=N=K")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--num-sms", type=int, default=132, help="SMs for the persistent grid (H100/H200: 132)")
    p.add_argument("--tile-n", type=int, default=128)
    p.add_argument("--tile-k", type=int, default=128)
    p.add_argument("--groups", type=int, default=8, help="groups for the grouped kernel (0: skip)")
    p.add_argument("--dry-run", action="store_true", help="CPU-safe: parse args, quantize a tiny problem, exit")
    return p.parse_args(argv)


def _time(fn, *args, iters: int, warmup: int) -> float:
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv=None) -> int:
    args = parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    from horizon.quant import formats as F
    from horizon.quant.matmul import blockscaled_matmul_reference
    from pallas_kernels import _common as C
    from pallas_kernels import blockscaled_matmul_hopper as H

    if args.dry_run:
        x = jax.random.normal(jax.random.key(0), (64, 64))
        q = F.quantize_mxfp8(x)
        print(f"dry-run ok: sizes={sizes} num_sms={args.num_sms} quantized {q.values.shape} {q.values.dtype}")
        return 0
    if jax.devices()[0].platform != "gpu":
        print("no GPU: run with --dry-run on CPU", file=sys.stderr)
        return 2
    cc = str(getattr(jax.devices()[0], "compute_capability", "0"))
    if cc.startswith("10"):
        return _blackwell(args, sizes)
    print(f"device: {jax.devices()[0].device_kind}")
    print(f"{'size':>6} {'max_rel_err':>11} {'pallas TF/s':>11} {'fp8 dot TF/s':>12} {'bf16 dot TF/s':>13} "
          f"{'vs fp8':>7} {'vs bf16':>7}")
    for s in sizes:
        m = n = k = s
        ka, kb = jax.random.split(jax.random.key(s))
        a = jax.random.normal(ka, (m, k), jnp.float32)
        b = jax.random.normal(kb, (n, k), jnp.float32)
        qa, qb = F.quantize_mxfp8(a), F.quantize_mxfp8(b)
        cfg = C.HopperConfig(64, min(args.tile_n, n), min(args.tile_k, k))
        kern = jax.jit(lambda av, asc, bv, bsc: H.mxfp8_matmul_from_parts(
            av, asc, bv, bsc, out_dtype=jnp.bfloat16, config=cfg, num_sms=args.num_sms))
        out = kern(qa.values, qa.scales, qb.values, qb.scales)
        ref = blockscaled_matmul_reference(qa, qb, out_dtype=jnp.float32)
        err = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref)) / jnp.max(jnp.abs(ref)))
        fp8_dot = jax.jit(lambda x, y: jnp.dot(x, y.T, preferred_element_type=jnp.float32))
        bf16_dot = jax.jit(lambda x, y: jnp.dot(x, y.T, preferred_element_type=jnp.float32))
        a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
        t_k = _time(kern, qa.values, qa.scales, qb.values, qb.scales, iters=args.iters, warmup=args.warmup)
        t_8 = _time(fp8_dot, qa.values, qb.values, iters=args.iters, warmup=args.warmup)
        t_16 = _time(bf16_dot, a16, b16, iters=args.iters, warmup=args.warmup)
        fl = 2.0 * m * n * k
        tk, t8, t16 = fl / t_k / 1e12, fl / t_8 / 1e12, fl / t_16 / 1e12
        print(f"{s:>6} {err:>11.2e} {tk:>11.1f} {t8:>12.1f} {t16:>13.1f} {tk / t8:>7.2f} {tk / t16:>7.2f}")
        if not np.isfinite(err) or err > 1e-2:
            print(f"  CORRECTNESS FAILURE at size {s}: rel err {err}", file=sys.stderr)
    if args.groups > 0:
        _grouped(args, sizes)
    return 0


def _rel_err(out, ref) -> float:
    return float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref)) / jnp.maximum(jnp.max(jnp.abs(ref)), 1e-30))


def _grouped(args, sizes) -> None:
    from horizon.quant import formats as F
    from horizon.quant.matmul import grouped_blockscaled_matmul_reference
    from pallas_kernels import _common as C
    from pallas_kernels import grouped_matmul as GM

    g = args.groups
    print(f"grouped MXFP8, G={g} (T=N=K=size, one empty group)")
    print(f"{'size':>6} {'max_rel_err':>11} {'pallas TF/s':>11} {'bf16 ragged TF/s':>16} {'vs bf16':>7}")
    for s in sizes:
        t = n = k = s
        ka, kb, kg = jax.random.split(jax.random.key(s), 3)
        a = jax.random.normal(ka, (t, k), jnp.float32)
        b = jax.random.normal(kb, (g, n, k), jnp.float32)
        cuts = jnp.sort(jax.random.randint(kg, (g - 1,), 0, t))
        gs = jnp.diff(jnp.concatenate([jnp.zeros(1, jnp.int32), cuts, jnp.full(1, t, jnp.int32)]))
        moved = int(gs[g // 2])
        gs = gs.at[g // 2].set(0).at[0].add(moved)  # one empty group; sizes still sum to T
        qa, qb = F.quantize_mxfp8(a), F.quantize_mxfp8(b)
        cfg = C.HopperConfig(64, min(args.tile_n, n), min(args.tile_k, k))
        kern = jax.jit(lambda av, asc, bv, bsc, gsz: GM.grouped_mxfp8_matmul_from_parts(
            av, asc, bv, bsc, gsz, out_dtype=jnp.bfloat16, config=cfg, num_sms=args.num_sms))
        out = kern(qa.values, qa.scales, qb.values, qb.scales, gs)
        err = _rel_err(out, grouped_blockscaled_matmul_reference(qa, qb, gs))
        a16, b16 = a.astype(jnp.bfloat16), jnp.swapaxes(b, 1, 2).astype(jnp.bfloat16)
        rag = jax.jit(lambda x, y, gsz: jax.lax.ragged_dot(x, y, gsz, preferred_element_type=jnp.float32))
        t_k = _time(kern, qa.values, qa.scales, qb.values, qb.scales, gs, iters=args.iters, warmup=args.warmup)
        t_r = _time(rag, a16, b16, gs, iters=args.iters, warmup=args.warmup)
        fl = 2.0 * t * n * k
        print(f"{s:>6} {err:>11.2e} {fl / t_k / 1e12:>11.1f} {fl / t_r / 1e12:>16.1f} {t_r / t_k:>7.2f}")
        if not np.isfinite(err) or err > 1e-2:
            print(f"  CORRECTNESS FAILURE (grouped) at size {s}: rel err {err}", file=sys.stderr)


def _blackwell(args, sizes) -> int:
    from horizon.quant import formats as F
    from horizon.quant.matmul import blockscaled_matmul_reference
    from pallas_kernels import blockscaled_matmul_blackwell as BW

    print(f"device: {jax.devices()[0].device_kind} (Blackwell tcgen05 kernels)")
    print(f"{'fmt':>6} {'size':>6} {'max_rel_err':>11} {'pallas TF/s':>11} {'bf16 dot TF/s':>13} {'vs bf16':>7}")
    for s in sizes:
        ka, kb = jax.random.split(jax.random.key(s))
        a = jax.random.normal(ka, (s, s), jnp.float32)
        b = jax.random.normal(kb, (s, s), jnp.float32)
        a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
        bf16_dot = jax.jit(lambda x, y: jnp.dot(x, y.T, preferred_element_type=jnp.float32))
        t_16 = _time(bf16_dot, a16, b16, iters=args.iters, warmup=args.warmup)
        fl = 2.0 * s**3
        for fmt in ("mxfp8", "nvfp4"):
            if fmt == "mxfp8":
                qa, qb = F.quantize_mxfp8(a), F.quantize_mxfp8(b)
                parts = (qa.values, qa.scales, qb.values, qb.scales)
                kern = jax.jit(lambda *x: BW.mxfp8_matmul_from_parts(*x, out_dtype=jnp.bfloat16))
            else:
                qa = F.quantize_nvfp4(a, scaling="per_token")
                qb = F.quantize_nvfp4(b, scaling="per_token")
                parts = (qa.values, qa.block_scales, qa.global_scale, qb.values, qb.block_scales, qb.global_scale)
                kern = jax.jit(lambda *x: BW.nvfp4_matmul_from_parts(*x, out_dtype=jnp.bfloat16))
            err = _rel_err(kern(*parts), blockscaled_matmul_reference(qa, qb, out_dtype=jnp.float32))
            t_k = _time(kern, *parts, iters=args.iters, warmup=args.warmup)
            print(f"{fmt:>6} {s:>6} {err:>11.2e} {fl / t_k / 1e12:>11.1f} {fl / t_16 / 1e12:>13.1f} "
                  f"{t_16 / t_k:>7.2f}")
            if not np.isfinite(err) or err > 1e-2:
                print(f"  CORRECTNESS FAILURE ({fmt}) at size {s}: rel err {err}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
