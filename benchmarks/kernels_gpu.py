"""The Hopper Pallas kernels on a GPU: error vs the pure-JAX reference and speed vs two XLA baselines (docs/SPEC.md §3).

Per kernel and shape (A [M, K] @ B [N, K]^T, written MxKxN):

* error: max |kernel - reference| / max |reference|, the reference being `horizon.quant`'s
  (`blockscaled_matmul_reference`: dequantize, f32 dot at HIGHEST precision) on the same device;
* time (median of `--iters` after `--warmup`, two input sets alternated) and TFLOP/s (2MNK / t) of
  (a) the Pallas kernel, (b) XLA's per-tensor FP8 dot (e4m3 x e4m3 -> bf16 through cuBLASLt: the speed
  ceiling, per-tensor rather than per-block scales; the compiled HLO's custom-call target is printed
  to show which GEMM XLA picked) and (c) dequantize-then-bf16 (the same maths in XLA: the block
  scales applied elementwise, an exact bf16 value, then a bf16 dot), and the kernel's ratio to both.

On a Blackwell GPU (sm_100) the dense rows time the tcgen05 kernels instead (never run anywhere yet).
Kernels: MXFP8 dense (per-32 promotion; `--tile-ns` sweeps tile_n, each with the promotion waited for and
overlapped with the next block's wgmma, `HopperConfig.overlap`), NVFP4 dense (per-token decode
scales, BF16 decode), grouped MoE MXFP8 (`--grouped T,G,K,N`: T expert-sorted rows over G experts,
random group sizes with one empty group; baselines: the dense per-tensor FP8 dot of the same FLOPs and
dequantize-then-`grouped_matmul` in bf16), and the two quantize kernels (bytes/s and bit-exactness vs
`horizon.quant.formats`' XLA quantizers, also timed).

Every measurement is printed as it is made and appended to `--json` (one record per line); a kernel
that fails to compile or run is reported with its error and the script goes on. `--interpret` runs
the kernels in the Mosaic GPU interpreter on CPU at small shapes (a check of this script, no timing
meaning). `--dry-run` only parses and quantizes a tiny problem.

    JAX_PLATFORMS=cuda python3 benchmarks/kernels_gpu.py --json $OUT/kernels.jsonl
    .venv/bin/python benchmarks/kernels_gpu.py --interpret      # CPU self-check of the script
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from horizon.quant import formats as F  # noqa: E402
from horizon.quant import grouped as GRP  # noqa: E402
from horizon.quant.matmul import blockscaled_matmul_reference, grouped_blockscaled_matmul_reference  # noqa: E402
from horizon.utils import progress, provenance  # noqa: E402

DEFAULT_SHAPES = "4096x7168x16384,4096x7168x2048,4096x2048x7168"


def roofline_tflops(fmt: str, tile_m: int = 64, tile_n: int = 128) -> float:
    """The format's Hopper ceiling at the data sheet's clock (docs/KERNELS.md "Roofline": promotion or decode
    overlapped with the MMA; MXFP8 with two instructions per element, NVFP4 with two per decoded element)."""
    from pallas_kernels import roofline  # noqa: PLC0415 - the kernels package, next to the GPU imports
    return roofline.fraction_of_fp8_peak(fmt, mode="overlapped", tile_m=tile_m, tile_n=tile_n) * \
        roofline.HOPPER.fp8_tflops
INTERPRET_SHAPES = "128x256x128"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=None, help=f"comma list of MxKxN (default {DEFAULT_SHAPES})")
    p.add_argument("--kernels", default="mxfp8,nvfp4,grouped,quantize")
    p.add_argument("--tile-ns", default="128,256", help="tile_n values for the MXFP8 dense kernel")
    p.add_argument("--grouped", default="32768,32,7168,2048",
                   help="T,G,K,N of the grouped kernel (default: DeepSeek-V3 gate/up, 256 experts / EP 8)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--num-sms", type=int, default=0, help="persistent grid size (0: the device's SM count)")
    p.add_argument("--json", default="", help="append one JSON record per measurement to this file")
    p.add_argument("--interpret", action="store_true", help="CPU: Mosaic GPU interpreter, small shapes")
    p.add_argument("--dry-run", action="store_true", help="CPU-safe: parse args, quantize a tiny problem, exit")
    return p.parse_args(argv)


def shapes_of(spec: str) -> list[tuple[int, int, int]]:
    out = []
    for s in spec.split(","):
        m, k, n = (int(v) for v in s.lower().split("x"))
        out.append((m, k, n))
    return out


class Bench:
    """Timing, error and record keeping shared by every measurement of one run."""

    def __init__(self, args, prov: provenance.Provenance | None = None):
        self.args = args
        self.prov = prov
        self.interp = None
        self.backend = "hopper"
        if not args.interpret:
            from pallas_kernels.dispatch import supported_backend
            self.backend = supported_backend() or "hopper"
        if args.interpret:
            from pallas_kernels import _common as C
            self.interp = C.interpret_params()

    def time(self, fn, inputs: list[tuple]) -> tuple[float, float]:
        """(median seconds per call over alternating input sets, first-call seconds incl. compile)."""
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*inputs[0]))
        first = time.perf_counter() - t0
        if self.args.interpret:
            return first, first
        for i in range(self.args.warmup):
            jax.block_until_ready(fn(*inputs[i % len(inputs)]))
        ts = []
        for i in range(self.args.iters):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*inputs[i % len(inputs)]))
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts), first

    def record(self, rec: dict) -> None:
        if self.args.json:
            rec = self.prov.stamp(rec) if self.prov is not None else rec
            with open(self.args.json, "a") as fh:
                fh.write(json.dumps(rec) + "\n")


def rel_err(out, ref) -> float:
    out, ref = jnp.asarray(out, jnp.float32), jnp.asarray(ref, jnp.float32)
    return float(jnp.max(jnp.abs(out - ref)) / jnp.maximum(jnp.max(jnp.abs(ref)), 1e-30))


def gemm_target(fn, *args) -> str:
    """The GEMM custom-call targets in `fn`'s compiled HLO (which library routine XLA chose)."""
    try:
        text = jax.jit(fn).lower(*args).compile().as_text()
    except Exception as e:  # noqa: BLE001 - diagnostic only
        return f"? ({type(e).__name__})"
    found = sorted({t for t in ("__cublas$lt$matmul$f8", "__cublas$lt$matmul", "__cublas$gemm", "__triton_gemm",
                                "__cudnn$", "triton_gemm") if t in text})
    return ",".join(found) or "no library GEMM (fused/emitted)"


def operands(key, m, k, n, fmt: str):
    """Random A [M, K], B [N, K] with K-block magnitudes that vary (so block scales differ), quantized."""
    ka, kb = jax.random.split(key)
    a = jax.random.normal(ka, (m, k)) * jnp.exp2(jnp.arange(k) // 32 % 5 - 2.0)
    b = jax.random.normal(kb, (n, k)) * jnp.exp2(-(jnp.arange(k) // 32 % 3) + 1.0)
    if fmt == "mxfp8":
        return F.quantize_mxfp8(a), F.quantize_mxfp8(b)
    return F.quantize_nvfp4(a, scaling="per_token"), F.quantize_nvfp4(b, scaling="per_token")


def fp8_per_tensor(qa, qb):
    """The speed ceiling's operands: one e4m3 tensor each, unit (per-tensor) scales (MXFP8's own values;
    NVFP4 dequantized and cast)."""
    return tuple(q.values if isinstance(q, F.MXTensor) else F.dequantize(q).astype(jnp.float8_e4m3fn)
                 for q in (qa, qb))


def fp8_dot(a, b):
    return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.bfloat16)


def dequant_bf16_dot(qa, qb):
    return jax.lax.dot_general(F.dequantize(qa, jnp.bfloat16), F.dequantize(qb, jnp.bfloat16),
                               (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32).astype(jnp.bfloat16)


def kernel_fn(fmt: str, bench: Bench, tile_n: int | None, overlap: bool = False):
    from pallas_kernels import _common as C
    from pallas_kernels import blockscaled_matmul_hopper as H
    sms = bench.args.num_sms
    if bench.backend == "blackwell":  # tcgen05 kernels (never run anywhere yet: read the error column first)
        from pallas_kernels import blockscaled_matmul_blackwell as BW

        def bw(qa, qb):
            if fmt == "mxfp8":
                return BW.mxfp8_matmul_from_parts(qa.values, qa.scales, qb.values, qb.scales, out_dtype=jnp.bfloat16)
            return BW.nvfp4_matmul_from_parts(qa.values, qa.block_scales, qa.global_scale, qb.values,
                                              qb.block_scales, qb.global_scale, out_dtype=jnp.bfloat16)
        return bw

    def f(qa, qb):
        m, n, k = qa.values.shape[0], qb.values.shape[0], qa.values.shape[1]
        cfg = H.auto_config(m, n, k)
        cfg = C.HopperConfig(cfg.tile_m, tile_n or cfg.tile_n, cfg.tile_k, overlap=overlap)
        if fmt == "mxfp8":
            return H.mxfp8_matmul_from_parts(qa.values, qa.scales, qb.values, qb.scales, out_dtype=jnp.bfloat16,
                                             config=cfg, num_sms=sms, interpret=bench.interp)
        return H.nvfp4_matmul_from_parts(F.pack_fp4(qa.values), qa.block_scales, qa.global_scale,
                                         F.pack_fp4(qb.values), qb.block_scales, qb.global_scale,
                                         out_dtype=jnp.bfloat16, config=cfg, num_sms=sms, interpret=bench.interp)
    return f


def dense(bench: Bench, fmt: str, shapes, tile_ns) -> None:
    print(f"\n{fmt.upper()} dense ({bench.backend} kernel) vs XLA per-tensor FP8 dot and dequantize->bf16 dot",
          flush=True)
    print(f"{'MxKxN':>18} {'tile_n':>6} {'max_err':>9} {'kernel TF/s':>11} {'fp8 dot TF/s':>12} "
          f"{'deq+bf16 TF/s':>13} {'vs fp8':>6} {'vs deq':>6} {'compile s':>9}", flush=True)
    for (m, k, n) in progress.progress(shapes, desc=f"{fmt} dense", unit="shape"):
        sets = [operands(jax.random.key(m + k + n + i), m, k, n, fmt) for i in range(2)]
        fl = 2.0 * m * n * k
        base = {}
        try:
            p8 = [fp8_per_tensor(*s) for s in sets]
            base["fp8"] = bench.time(jax.jit(fp8_dot), p8)[0]
            base["fp8_target"] = gemm_target(fp8_dot, *p8[0])
            base["deq"] = bench.time(jax.jit(dequant_bf16_dot), sets)[0]
        except Exception as e:  # noqa: BLE001
            progress.say(f"  baseline failed at {m}x{k}x{n}: {type(e).__name__}: {str(e)[:300]}")
        ref = blockscaled_matmul_reference(*sets[0], out_dtype=jnp.float32)
        # MXFP8 on Hopper: every tile_n with promotion waited for and overlapped (HopperConfig.overlap)
        variants = ([(tn, ov) for tn in tile_ns for ov in (False, True)] if fmt == "mxfp8" and bench.backend == "hopper"
                    else [(None, False)])
        for tn, ov in variants:
            rec = dict(kernel=f"{fmt}_dense", shape=f"{m}x{k}x{n}", tile_n=tn, overlap=ov, flops=fl,
                       fp8_dot_s=base.get("fp8"), deq_bf16_s=base.get("deq"), fp8_gemm=base.get("fp8_target"))
            tag = f"{tn}{'+ov' if ov else ''}"
            try:
                kf = jax.jit(kernel_fn(fmt, bench, tn, ov))
                t, first = bench.time(kf, sets)
                err = rel_err(kf(*sets[0]), ref)
                rec.update(seconds=t, first_call_s=first, max_err=err, tflops=fl / t / 1e12,
                           of_roofline=fl / t / 1e12 / roofline_tflops(fmt, 64, tn or 128))
                r8 = base["fp8"] / t if "fp8" in base else float("nan")
                rd = base["deq"] / t if "deq" in base else float("nan")
                progress.say(f"{m:>6}x{k}x{n:<6} {tag:>6} {err:>9.2e} {fl / t / 1e12:>11.1f} "
                             f"{fl / base.get('fp8', float('nan')) / 1e12:>12.1f} "
                             f"{fl / base.get('deq', float('nan')) / 1e12:>13.1f} "
                             f"{r8:>6.2f} {rd:>6.2f} {first:>9.1f}  of roofline {rec['of_roofline']:.2f}")
                if not np.isfinite(err) or err > 1e-2:
                    progress.say(f"  CORRECTNESS FAILURE: {fmt} {m}x{k}x{n} tile_n={tag}: max err {err}")
            except Exception as e:  # noqa: BLE001
                rec["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
                progress.say(f"{m:>6}x{k}x{n:<6} {tag:>6} FAILED {rec['error'][:400]}")
                traceback.print_exc(limit=3)
            bench.record(rec)
        if "fp8_target" in base:
            progress.say(f"  (per-tensor FP8 dot compiled to: {base['fp8_target']})")


def grouped_operands(key, t, g, k, n):
    ka, kb, kg = jax.random.split(key, 3)
    a = jax.random.normal(ka, (t, k), jnp.float32)
    b = jax.random.normal(kb, (g, n, k), jnp.float32)
    cuts = jnp.sort(jax.random.randint(kg, (g - 1,), 0, t))
    gs = jnp.diff(jnp.concatenate([jnp.zeros(1, jnp.int32), cuts, jnp.full(1, t, jnp.int32)])).astype(jnp.int32)
    moved = gs[g // 2]
    gs = gs.at[g // 2].set(0).at[0].add(moved)  # one empty group; sizes still sum to T
    return F.quantize_mxfp8(a), F.quantize_mxfp8(b), gs


def grouped(bench: Bench, spec: str) -> None:
    from pallas_kernels import grouped_matmul as GM
    t, g, k, n = (int(v) for v in spec.split(","))
    print(f"\ngrouped MoE MXFP8 (Hopper kernel): T={t} rows over G={g} experts (one empty), K={k}, N={n}", flush=True)
    sets = [grouped_operands(jax.random.key(t + g + i), t, g, k, n) for i in range(2)]
    fl = 2.0 * t * n * k
    rec = dict(kernel="mxfp8_grouped", shape=f"T{t}_G{g}_K{k}_N{n}", flops=fl)
    try:  # baselines: dense per-tensor FP8 dot of the same FLOPs; dequantize -> bf16 grouped GEMM
        p8 = [(qa.values, qb.values[0]) for qa, qb, _ in sets]  # [T, K] x [N, K]^T: T*N*K MACs
        rec["fp8_dense_same_flops_s"] = bench.time(jax.jit(fp8_dot), p8)[0]
        impl = GRP.choose_impl("auto")
        deq = lambda qa, qb, gs: GRP.grouped_matmul(  # noqa: E731
            F.dequantize(qa, jnp.bfloat16), jnp.swapaxes(F.dequantize(qb, jnp.bfloat16), 1, 2), gs, impl=impl)
        rec["deq_bf16_grouped_s"] = bench.time(jax.jit(deq), sets)[0]
        rec["deq_bf16_grouped_impl"] = impl
    except Exception as e:  # noqa: BLE001
        print(f"  baseline failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
    try:
        kf = jax.jit(lambda qa, qb, gs: GM.grouped_mxfp8_matmul_from_parts(
            qa.values, qa.scales, qb.values, qb.scales, gs, out_dtype=jnp.bfloat16,
            num_sms=bench.args.num_sms, interpret=bench.interp))
        ts, first = bench.time(kf, sets)
        err = rel_err(kf(*sets[0]), grouped_blockscaled_matmul_reference(*sets[0]))
        rec.update(seconds=ts, first_call_s=first, max_err=err, tflops=fl / ts / 1e12,
                   of_roofline=fl / ts / 1e12 / roofline_tflops("mxfp8"))
        f8 = rec.get("fp8_dense_same_flops_s", float("nan"))
        dq = rec.get("deq_bf16_grouped_s", float("nan"))
        print(f"  max_err {err:.2e}  kernel {fl / ts / 1e12:.1f} TF/s ({ts * 1e3:.2f} ms)  "
              f"dense fp8 dot of the same FLOPs {fl / f8 / 1e12:.1f} TF/s  "
              f"dequant->bf16 grouped ({rec.get('deq_bf16_grouped_impl')}) {fl / dq / 1e12:.1f} TF/s  "
              f"ratios {f8 / ts:.2f} / {dq / ts:.2f}  of roofline {rec['of_roofline']:.2f}  "
              f"compile+first {first:.1f} s", flush=True)
        if not np.isfinite(err) or err > 1e-2:
            print(f"  CORRECTNESS FAILURE: grouped max err {err}", flush=True)
    except Exception as e:  # noqa: BLE001
        rec["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
        print(f"  grouped FAILED {rec['error'][:400]}", flush=True)
        traceback.print_exc(limit=3)
    bench.record(rec)


def bits(x):
    """An array's bit patterns (fp4 as its E2M1 codes), for bit-exact comparison."""
    if x.dtype == jnp.float4_e2m1fn:
        return F.fp4_codes(x)
    return jax.lax.bitcast_convert_type(x, {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize])


def quantize(bench: Bench, rows: int, k: int) -> None:
    from pallas_kernels import quantize as Q
    print(f"\nquantize kernels (generic Pallas) on [{rows}, {k}] bf16 vs XLA's quantizers", flush=True)
    xs = [(jax.random.normal(jax.random.key(i), (rows, k), jnp.float32) * 3).astype(jnp.bfloat16,) for i in range(2)]
    xs = [(x,) for x in xs]
    cases = {
        "mxfp8": (lambda x: Q.quantize_mxfp8_pallas(x, interpret=bool(bench.interp)), lambda x: F.quantize_mxfp8(x),
                  rows * k * 2 + rows * k + rows * k // 32),
        "nvfp4_per_token": (lambda x: Q.quantize_nvfp4_per_token_pallas(x, interpret=bool(bench.interp)),
                            lambda x: F.quantize_nvfp4(x, scaling="per_token"),
                            rows * k * 2 + rows * k // 2 + rows * k // 16 + 4 * rows),
    }
    for name, (kern, xla, nbytes) in cases.items():
        rec = dict(kernel=f"quantize_{name}", shape=f"{rows}x{k}", bytes=nbytes)
        try:
            tx, _ = bench.time(jax.jit(xla), xs)
            rec["xla_s"] = tx
            tk, first = bench.time(jax.jit(kern), xs)
            got, want = jax.jit(kern)(*xs[0]), jax.jit(xla)(*xs[0])
            exact = all(bool(jnp.all(bits(a) == bits(b))) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
            rec.update(seconds=tk, first_call_s=first, bit_exact=exact, gbps=nbytes / tk / 1e9)
            print(f"  {name:>16}: kernel {nbytes / tk / 1e9:7.1f} GB/s ({tk * 1e6:.0f} us), "
                  f"XLA {nbytes / tx / 1e9:7.1f} GB/s "
                  f"({tx * 1e6:.0f} us), ratio {tx / tk:.2f}, bit-exact {exact}", flush=True)
        except Exception as e:  # noqa: BLE001
            rec["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
            print(f"  {name:>16}: FAILED {rec['error'][:400]}", flush=True)
        bench.record(rec)


def main(argv=None) -> int:
    args = parse_args(argv)
    prov = provenance.announce(config=vars(args))
    shapes = shapes_of(args.shapes or (INTERPRET_SHAPES if args.interpret else DEFAULT_SHAPES))
    if args.dry_run:
        q = F.quantize_mxfp8(jax.random.normal(jax.random.key(0), (64, 64)))
        print(f"dry-run ok: shapes={shapes} quantized {q.values.shape} {q.values.dtype}")
        return 0
    dev = jax.devices()[0]
    if not args.interpret and dev.platform != "gpu":
        print("no GPU: run with --interpret (or --dry-run) on CPU", file=sys.stderr)
        return 2
    if not args.num_sms:
        from pallas_kernels.dispatch import device_sm_count
        args.num_sms = 4 if args.interpret else device_sm_count()
    print(f"device {dev.device_kind} ({getattr(dev, 'compute_capability', '-')}), jax {jax.__version__}, "
          f"num_sms {args.num_sms}", flush=True)
    bench = Bench(args, prov)
    todo = args.kernels.split(",")
    tile_ns = [int(v) for v in args.tile_ns.split(",")] if not args.interpret else [64]
    for fmt in ("mxfp8", "nvfp4"):
        if fmt in todo:
            dense(bench, fmt, shapes, tile_ns)
    if bench.backend != "hopper":
        todo = [t for t in todo if t not in ("grouped",)]  # the grouped kernel is Hopper-only
    if "grouped" in todo:
        grouped(bench, "200,4,256,128" if args.interpret else args.grouped)
    if "quantize" in todo:
        quantize(bench, *((64, 256) if args.interpret else (16384, 7168)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
