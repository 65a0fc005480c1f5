"""Fused quantize kernels: bf16/f32 -> MXFP8 and -> NVFP4 (per-token) with scales (docs/SPEC.md §3).

Generic Pallas (`pl.pallas_call`) kernels over row tiles: each program loads a
[tile_rows, K] tile once and emits values + scales in the same pass (one HBM read
of the activations, no separate amax pass). Both formats are row-local (MX blocks
and NVFP4 per-token amax never cross rows), so row tiling is exact. The per-element
math is `horizon.quant.formats`' own (applied to the tile inside the kernel), so the
kernel is bit-exact with the reference by construction; the tests check it on random
inputs including zeros and outliers. Runs with `interpret=True` on CPU; on GPU it
lowers through the default (Triton) Pallas backend.
NVFP4 values leave the kernel packed (uint8, low nibble = even element, as
`formats.pack_fp4`), which halves the bytes written.
Division mode ("ieee" | "approx") is the docs/SPEC.md §3 ablation switch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jaxtyping import Array, Float

from horizon.quant import formats as F

DEFAULT_TILE_ROWS = 8


def _rows_2d(x: Array) -> tuple[Array, tuple[int, ...]]:
    if x.ndim < 1:
        raise ValueError("quantize needs at least one axis (the contraction axis is last)")
    lead = x.shape[:-1]
    return x.reshape(-1, x.shape[-1]), lead


def _tile_rows(rows: int, tile_rows: int) -> int:
    t = min(tile_rows, rows)
    while rows % t:
        t -= 1
    return t


def quantize_mxfp8_pallas(
    x: Float[Array, "*batch k"], *, scale_rule: str = "rceil", tile_rows: int = DEFAULT_TILE_ROWS,
    interpret: bool = False,
) -> F.MXTensor:
    """bf16/f32 -> MXFP8 (e4m3 values, e8m0 scale per 32 along K) in one Pallas pass."""
    x2, lead = _rows_2d(x)
    rows, k = x2.shape
    if k % F.MX_BLOCK:
        raise ValueError(f"K={k} must be a multiple of {F.MX_BLOCK}")
    tr = _tile_rows(rows, tile_rows)

    def kern(x_ref, v_ref, s_ref):
        q = F.quantize_mxfp8(x_ref[...], scale_rule=scale_rule)
        v_ref[...] = q.values
        s_ref[...] = jax.lax.bitcast_convert_type(q.scales, jnp.uint8)

    vals, sbytes = pl.pallas_call(
        kern,
        grid=(rows // tr,),
        in_specs=[pl.BlockSpec((tr, k), lambda i: (i, 0))],
        out_specs=[pl.BlockSpec((tr, k), lambda i: (i, 0)),
                   pl.BlockSpec((tr, k // F.MX_BLOCK), lambda i: (i, 0))],
        out_shape=[jax.ShapeDtypeStruct((rows, k), jnp.float8_e4m3fn),
                   jax.ShapeDtypeStruct((rows, k // F.MX_BLOCK), jnp.uint8)],
        interpret=interpret,
    )(x2)
    scales = jax.lax.bitcast_convert_type(sbytes, jnp.float8_e8m0fnu)
    return F.MXTensor(vals.reshape(*lead, k), scales.reshape(*lead, k // F.MX_BLOCK))


def quantize_nvfp4_per_token_pallas_packed(
    x: Float[Array, "*batch k"], *, division: str = "ieee", tile_rows: int = DEFAULT_TILE_ROWS,
    interpret: bool = False,
) -> tuple[Array, Array, Array]:
    """bf16/f32 -> NVFP4 per-token: (packed uint8 [..,K/2], e4m3 block scales [..,K/16], f32 decode scale [..,1])."""
    x2, lead = _rows_2d(x)
    rows, k = x2.shape
    if k % F.NVFP4_BLOCK:
        raise ValueError(f"K={k} must be a multiple of {F.NVFP4_BLOCK}")
    tr = _tile_rows(rows, tile_rows)

    def kern(x_ref, p_ref, s_ref, g_ref):
        q = F.quantize_nvfp4(x_ref[...], scaling="per_token", division=division)
        p_ref[...] = F.pack_fp4(q.values)
        s_ref[...] = jax.lax.bitcast_convert_type(q.block_scales, jnp.uint8)
        g_ref[...] = q.global_scale

    packed, sbytes, g = pl.pallas_call(
        kern,
        grid=(rows // tr,),
        in_specs=[pl.BlockSpec((tr, k), lambda i: (i, 0))],
        out_specs=[pl.BlockSpec((tr, k // 2), lambda i: (i, 0)),
                   pl.BlockSpec((tr, k // F.NVFP4_BLOCK), lambda i: (i, 0)),
                   pl.BlockSpec((tr, 1), lambda i: (i, 0))],
        out_shape=[jax.ShapeDtypeStruct((rows, k // 2), jnp.uint8),
                   jax.ShapeDtypeStruct((rows, k // F.NVFP4_BLOCK), jnp.uint8),
                   jax.ShapeDtypeStruct((rows, 1), jnp.float32)],
        interpret=interpret,
    )(x2)
    scales = jax.lax.bitcast_convert_type(sbytes, jnp.float8_e4m3fn)
    return (packed.reshape(*lead, k // 2), scales.reshape(*lead, k // F.NVFP4_BLOCK), g.reshape(*lead, 1))


def quantize_nvfp4_per_token_pallas(
    x: Float[Array, "*batch k"], *, division: str = "ieee", tile_rows: int = DEFAULT_TILE_ROWS,
    interpret: bool = False,
) -> F.NVFP4Tensor:
    """Same as the packed variant, returned as an `NVFP4Tensor` (values unpacked to float4_e2m1fn)."""
    packed, scales, g = quantize_nvfp4_per_token_pallas_packed(
        x, division=division, tile_rows=tile_rows, interpret=interpret)
    return F.NVFP4Tensor(F.unpack_fp4(packed), scales, g)
