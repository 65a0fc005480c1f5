"""Shared helpers for the Mosaic GPU kernels (docs/SPEC.md §3).

The same kernel body runs in two places: compiled by Mosaic GPU (real GPU, or
`jax.export` lowering on CPU) and under the Mosaic GPU *interpreter*
(`InterpretGPUParams`) on CPU. Two Mosaic primitives have no interpreter rule in
jax 0.10.2: `layout_cast` and `plgpu.load` (the layout-annotated load). Both only
carry register-layout hints, which mean nothing off-GPU, so the helpers below drop
the hint when interpreting and keep it otherwise. Everything else (TMA copies,
barriers, wgmma, loops) is the same code on both paths.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

# Default SM counts, used only when the caller passes none (never queried from the
# device: `get_default_device().core_count` fails off-GPU; see REFERENCES.md).
H100_SMS = 132
H200_SMS = 132
B200_SMS = 148

E8M0_BIAS = 127


def interpret_params() -> Any:
    """Mosaic GPU interpret-mode parameters (CPU); deterministic zero-filled SMEM."""
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams  # noqa: PLC0415 - private jax module

    return InterpretGPUParams(uninitialized_memory="zero")


def is_interpret(interpret: Any) -> bool:
    return interpret is not None and interpret is not False


def with_layout(x: jax.Array, layout: Any, interpret: Any) -> jax.Array:
    """`plgpu.layout_cast` on GPU; identity under the interpreter (hint only)."""
    if is_interpret(interpret):
        return x
    return plgpu.layout_cast(x, layout)


def load_with_layout(ref: Any, idx: Any, layout: Any, interpret: Any, *, optimized: bool = True) -> jax.Array:
    """`plgpu.load(ref, idx, layout=...)` on GPU; plain `ref[idx]` under the interpreter.

    optimized=False lets Mosaic emit a transfer with SMEM bank conflicts when it cannot plan a
    conflict-free one (slower, still correct)."""
    if is_interpret(interpret):
        return ref[idx]
    return plgpu.load(ref, idx, layout=layout, optimized=optimized)


def wgmma_nt(acc_ref: Any, a_ref: Any, b_ref: Any, interpret: Any) -> None:
    """acc += a @ b.T for SMEM refs a [M, K], b [N, K] (K-major B, required for 8-bit wgmma).

    On GPU this is `plgpu.wgmma(acc, a, transpose_ref(b))`. The jax 0.10.2 interpreter's
    wgmma only understands slicing transforms, so there the transposed view of B is
    materialised in a scratch SMEM buffer first (same values; interpreter-only).
    """
    if not is_interpret(interpret):
        plgpu.wgmma(acc_ref, a_ref, plgpu.transpose_ref(b_ref, (1, 0)))
        return
    n, k = b_ref.shape

    def inner(bt_ref):
        bt_ref[...] = b_ref[...].T
        plgpu.wgmma(acc_ref, a_ref, bt_ref)

    pl.run_scoped(inner, plgpu.SMEM((k, n), b_ref.dtype))


def accumulator_load(acc_ref: Any, wait_n: int, interpret: Any) -> jax.Array:
    """The value of a wgmma accumulator once at most `wait_n` wgmma groups are still in flight
    (`plgpu.wgmma_accumulator_load`); under the interpreter, whose wgmma is synchronous, a plain read."""
    if is_interpret(interpret):
        return acc_ref[...]
    return plgpu.wgmma_accumulator_load(acc_ref, wait_n=wait_n)


def smem_transforms(minor_elems: int, dtype: Any) -> tuple[Any, ...]:
    """Tiling + swizzle transforms for an SMEM operand whose minor dim holds `minor_elems`."""
    swizzle = plgpu.find_swizzle(minor_elems * jnp.dtype(dtype).itemsize * 8)
    swizzle_elems = swizzle // jnp.dtype(dtype).itemsize
    return (plgpu.TilingTransform((8, swizzle_elems)), plgpu.SwizzleTransform(swizzle))


def e8m0_to_f32(s: jax.Array) -> jax.Array:
    """Exact E8M0 -> f32 (2^(byte-127)) via bits; byte 0xFF (NaN) maps to NaN."""
    byte = jax.lax.bitcast_convert_type(s, jnp.uint8).astype(jnp.int32)
    # byte 0 = 2^-127 is subnormal in f32: build it with ldexp-like multiply, not bits.
    val = jnp.exp2((byte - E8M0_BIAS).astype(jnp.float32))
    return jnp.where(byte == 255, jnp.nan, val)


@dataclasses.dataclass(frozen=True)
class HopperConfig:
    """Tiling of the Hopper block-scaled kernels (docs/SPEC.md §3).

    tile_m: rows of A per CTA (multiple of 64: one warpgroup wgmma M).
    tile_n: rows of B per CTA (multiple of 8, <= 256: wgmma N limit).
    tile_k: K elements loaded per TMA step (multiple of the scale block).
    overlap: MXFP8 only: two partial-sum accumulators, so scale block j+1's wgmma is in flight while block j
      is promoted (docs/KERNELS.md "Roofline": the promotion bounds the kernel at 1/3 of the FP8 peak when
      waited for, 1/2 when overlapped). Off by default until a GPU run has timed it.
    """

    tile_m: int = 64
    tile_n: int = 128
    tile_k: int = 128
    overlap: bool = False

    def check(self) -> None:
        if self.tile_m % 64:
            raise ValueError(f"tile_m={self.tile_m} must be a multiple of 64 (wgmma M)")
        if self.tile_n % 8 or not 8 <= self.tile_n <= 256:
            raise ValueError(f"tile_n={self.tile_n} must be a multiple of 8 in [8, 256]")


def check_divisible(name: str, value: int, tile: int) -> None:
    if value % tile:
        raise ValueError(f"{name}={value} must be a multiple of the tile size {tile}")


def np_dtype(x: Any) -> np.dtype:
    return np.dtype(jnp.dtype(x))
