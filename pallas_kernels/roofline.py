"""Hopper ceilings of block-scaled matmuls without a block-scaled MMA (docs/KERNELS.md "Roofline"): arithmetic only.

Per SM and clock, sm_90's tensor core does `fp8_fma` FP8 or `bf16_fma` BF16 multiply-adds (dense) and its four
schedulers dispatch 4 x 32 = `issue_lanes` lane-instructions, the FP32 pipe's rate. A scale block of width K whose
partial sum is promoted with c FP32 instructions per accumulator element costs c / issue_lanes clocks per element
per block against K / fp8_fma clocks of MMA. Promotion overlapped with the next block's MMA bounds the kernel
at 1 / max(1, ratio) of the FP8 peak; waited for (one accumulator) at 1 / (1 + ratio). NVFP4 decoded to exact
BF16 in the kernel has no promotion: d instructions per decoded element, tile_m + tile_n elements per K step
of a tile_m x tile_n tile, against BF16's MMA rate (half of FP8's). Register pressure, SMEM bandwidth and the
memory system are not modelled: these are upper bounds from the two pipes alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    name: str
    sms: int
    fp8_fma: int          # dense FP8 MMA multiply-adds per SM per clock
    bf16_fma: int         # dense BF16 MMA multiply-adds per SM per clock
    issue_lanes: int      # lane-instructions issued per SM per clock (= FP32 FMA lanes)
    fp8_tflops: float     # data-sheet dense peaks at the boost clock (2 FLOPs per multiply-add)
    bf16_tflops: float


# H100 / H200 SXM (the same SM and clocks): 1978.9 / 989.4 dense TF/s = 132 SMs x 8192 / 4096 FLOPs x 1.83 GHz
HOPPER = Hardware("H100/H200 SXM (sm_90)", sms=132, fp8_fma=4096, bf16_fma=2048, issue_lanes=128,
                  fp8_tflops=1978.9, bf16_tflops=989.4)


@dataclass(frozen=True)
class Format:
    block_k: int          # K width of one scale block (one promotion per block)
    promote_ops: float    # FP32 instructions per accumulator element per block


# mxfp8: acc += (sa[row] * sb[col]) * partial, scales per 32 along K on both operands: a multiply and a fused add.
# nvfp4_fp8_promotion: NVFP4 through FP8 wgmma (E2M1 x E4M3 is not exact in E4M3, so per-16 promotion).
# k128_deepgemm: DeepGEMM's per-128 blocks with one weight scale per 128 x 128 block: sa[row] * sb is formed once
# per row and block, so one fused add per element.
# mxfp8_zeroed: the same with a fresh zeroed accumulator per block (one more instruction per element), as a kernel
# that allocates its partial-sum accumulator per block does unless the wgmma skips the old accumulator.
FORMATS = {"mxfp8": Format(32, 2.0), "mxfp8_zeroed": Format(32, 3.0), "nvfp4_fp8_promotion": Format(16, 2.0),
           "k128_deepgemm": Format(128, 1.0)}
MODES = ("overlapped", "serialized")


def promotion_ratio(fmt: str, hw: Hardware = HOPPER) -> float:
    """Clocks of promotion per clock of FP8 MMA for a promoted format of `FORMATS`."""
    f = FORMATS[fmt]
    return f.promote_ops * hw.fp8_fma / (hw.issue_lanes * f.block_k)


def decode_ratio(decode_ops: float, tile_m: int, tile_n: int, hw: Hardware = HOPPER) -> float:
    """Clocks of in-kernel decode per clock of BF16 MMA for a tile_m x tile_n tile (NVFP4 -> BF16)."""
    return decode_ops * (tile_m + tile_n) * hw.bf16_fma / (hw.issue_lanes * tile_m * tile_n)


def _bound(ratio: float, mode: str) -> float:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return 1.0 / max(1.0, ratio) if mode == "overlapped" else 1.0 / (1.0 + ratio)


def fraction_of_fp8_peak(fmt: str, *, mode: str, tile_m: int = 64, tile_n: int = 128, decode_ops: float = 2.0,
                         hw: Hardware = HOPPER) -> float:
    """The ceiling as a fraction of the dense FP8 peak: a promoted format of `FORMATS`, or ``"nvfp4"`` (BF16
    decode, `decode_ops` per element; the BF16 MMA is `bf16_fma / fp8_fma` of the FP8 peak)."""
    if fmt == "nvfp4":
        return hw.bf16_fma / hw.fp8_fma * _bound(decode_ratio(decode_ops, tile_m, tile_n, hw), mode)
    return _bound(promotion_ratio(fmt, hw), mode)


def grouped_waste(rows: int, groups: int, tile_m: int) -> float:
    """Row-tile visits over dense row tiles when each of the groups - 1 boundaries falls inside a tile (random
    group sizes, `pallas_kernels.grouped_matmul`'s schedule visits a straddling tile once per group)."""
    tiles = math.ceil(rows / tile_m)
    return (tiles + groups - 1) / tiles
