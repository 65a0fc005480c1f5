"""Hopper ceilings of the block-scaled kernels (docs/KERNELS.md "Roofline"), and the recorded H200 runs against them.

    python benchmarks/kernel_roofline.py [--runs docs/gpu/2026-12-04] [--json]

Hopper has no block-scaled MMA, so a scale block's partial sum leaves the tensor core and is scaled and added
on the FP32 pipe ("promotion", `pallas_kernels/blockscaled_matmul_hopper.py`). Per SM and clock (sm_90,
`roofline.HOPPER`) the tensor core does 4096 FP8 or 2048 BF16 multiply-adds and the FP32 pipe 128 lane
operations, so a format whose scale block is K wide and whose promotion costs c instructions per accumulator
element spends c * 4096 / (128 * K) clocks on promotion per clock of FP8 MMA. For MX (K = 32, c = 2:
scale product, then the fused add) that is 2: the promotion, not the tensor core, bounds the kernel, at 1/2
of the FP8 peak when it overlaps the next block's wgmma and 1/3 when it waits for it (today's kernel).
NVFP4 decoded to BF16 in the kernel (exact, no promotion) pays d instructions per decoded element,
(tile_m + tile_n) elements per K step of a tile_m x tile_n tile, against BF16's MMA rate.

The ceilings are printed in TF/s at the data sheet's peak (H100/H200 SXM: 1979 FP8 / 989 BF16 dense at the
1830 MHz boost clock; the per-clock rates hold at any clock) and at the FP8 dot measured in the same recorded
run, with each recorded kernel's TF/s as a fraction of them. No GPU is needed: the runs are read from their
JSONL (`benchmarks/gpu_check.py` wrote them).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from pallas_kernels import roofline

REPO = pathlib.Path(__file__).resolve().parents[1]
# kernel -> (format, tile_m, tile_n): `pallas_kernels._common.HopperConfig`'s default tile, which the runs used
KERNELS = {"mxfp8_dense": ("mxfp8", 64, 128), "mxfp8_grouped": ("mxfp8", 64, 128), "nvfp4_dense": ("nvfp4", 64, 128)}


def read_runs(folder: pathlib.Path) -> tuple[dict, list[dict]]:
    """(the device record of run1, the timed matmul records of the folder's *-kernels.jsonl)."""
    device = {}
    for line in (folder / "run1-gpu_check.log").read_text().splitlines():
        line = line.strip()
        if line.startswith("{") and "fp8_per_tensor_peak_tflops" in line:
            device = json.loads(line)
    rows = [json.loads(x) for f in sorted(folder.glob("*-kernels.jsonl")) for x in f.read_text().splitlines() if x]
    return device, [r for r in rows if r.get("kernel") in KERNELS and "tflops" in r]    # the timed matmuls


def grouped_visits(shape: str, tile_m: int) -> float:
    """`roofline.grouped_waste` of a grouped shape ``T<t>_G<g>_K<k>_N<n>`` (benchmarks/kernels_gpu.py draws random
    group sizes)."""
    parts = {p[0]: int(p[1:]) for p in shape.split("_")}
    return roofline.grouped_waste(parts["T"], parts["G"], tile_m)


def table(device: dict, rows: list[dict]) -> list[dict]:
    measured_fp8 = float(device.get("fp8_per_tensor_peak_tflops", float("nan")))
    out = []
    for r in rows:
        fmt, tm, tn = KERNELS[r["kernel"]]
        tn = int(r.get("tile_n") or tn)
        waste = grouped_visits(r["shape"], tm) if r["kernel"] == "mxfp8_grouped" else 1.0
        for mode in ("overlapped", "serialized"):
            frac = roofline.fraction_of_fp8_peak(fmt, mode=mode, tile_m=tm, tile_n=tn) / waste
            out.append(dict(kernel=r["kernel"], shape=r["shape"], tile=f"{tm}x{tn}", mode=mode,
                            ceiling_of_fp8_peak=frac, ceiling_tflops_datasheet=frac * roofline.HOPPER.fp8_tflops,
                            ceiling_tflops_measured_clock=frac * measured_fp8, kernel_tflops=r["tflops"],
                            of_ceiling_datasheet=r["tflops"] / (frac * roofline.HOPPER.fp8_tflops),
                            of_ceiling_measured=r["tflops"] / (frac * measured_fp8)))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default=str(REPO / "docs/gpu/2026-12-04"), help="a recorded GPU run's folder")
    p.add_argument("--json", action="store_true", help="one JSON record per line instead of the table")
    a = p.parse_args(argv)
    hw = roofline.HOPPER
    print(f"Hopper per SM per clock: FP8 MMA {hw.fp8_fma} FMA, BF16 MMA {hw.bf16_fma} FMA, issue {hw.issue_lanes} "
          f"lanes; data sheet {hw.fp8_tflops:.0f} / {hw.bf16_tflops:.0f} TF/s (FP8 / BF16 dense, {hw.sms} SMs)")
    for fmt in roofline.FORMATS:
        f = roofline.FORMATS[fmt]
        print(f"  {fmt}: scale block K={f.block_k}, {f.promote_ops} FP32 ops per accumulator element per block -> "
              f"promotion / MMA time {roofline.promotion_ratio(fmt):.2f}; ceiling "
              f"{roofline.fraction_of_fp8_peak(fmt, mode='overlapped'):.3f} (overlapped) / "
              f"{roofline.fraction_of_fp8_peak(fmt, mode='serialized'):.3f} (serialized) of the FP8 peak")
    for tm, tn in ((64, 128), (128, 256)):
        for d in (1.0, 2.0, 4.0):
            print(f"  nvfp4 -> bf16 decode, tile {tm}x{tn}, {d:g} ops per decoded element: decode / MMA time "
                  f"{roofline.decode_ratio(d, tm, tn):.3f}; ceiling "
                  f"{roofline.fraction_of_fp8_peak('nvfp4', mode='overlapped', tile_m=tm, tile_n=tn, decode_ops=d):.3f}"
                  f" (overlapped) / "
                  f"{roofline.fraction_of_fp8_peak('nvfp4', mode='serialized', tile_m=tm, tile_n=tn, decode_ops=d):.3f}"
                  " (serialized) of the FP8 peak")
    device, rows = read_runs(pathlib.Path(a.runs))
    print(f"\nrecorded run {a.runs}: {device.get('device')} (jax {device.get('jax')}), measured FP8 dot "
          f"{device.get('fp8_per_tensor_peak_tflops', float('nan')):.0f} TF/s (n^3), BF16 "
          f"{device.get('bf16_peak_tflops', float('nan')):.0f} TF/s")
    recs = table(device, rows)
    if a.json:
        for r in recs:
            print(json.dumps(r))
        return 0
    print(f"{'kernel':14} {'shape':24} {'tile':7} {'mode':10} {'ceiling':>8} {'TF/s ds':>8} {'TF/s meas':>9} "
          f"{'kernel':>7} {'of ds':>6} {'of meas':>7}")
    for r in recs:
        print(f"{r['kernel']:14} {r['shape']:24} {r['tile']:7} {r['mode']:10} {r['ceiling_of_fp8_peak']:8.3f} "
              f"{r['ceiling_tflops_datasheet']:8.0f} {r['ceiling_tflops_measured_clock']:9.0f} "
              f"{r['kernel_tflops']:7.0f} "
              f"{r['of_ceiling_datasheet']:6.2f} {r['of_ceiling_measured']:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
