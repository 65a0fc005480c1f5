"""MXFP8 and NVFP4 block-scaled formats: quantize / dequantize with explicit rounding (docs/SPEC.md §3).

Blocks always run along the LAST axis (the matmul contraction axis, K-major layout); K must be a
multiple of the block size. All scale arithmetic is float32.

MXFP8 (OCP MX v1.0): E4M3 elements, one E8M0 (power-of-two) scale per 32 elements.
  Shared exponent ``e`` from the block amax ``a`` (finite blocks):
    * ``scale_rule="floor"`` (the OCP spec): ``e = floor(log2 a) - 8`` (8 = emax of E4M3). Elements
      ``a / 2^e`` lie in [256, 512): values above 448 are saturated to 448 (the floor rule's clipping).
    * ``scale_rule="rceil"`` (NVIDIA TE / torchao / cuDNN; default): ``e`` = the smallest integer with
      ``a <= 448 * 2^e``, i.e. ``ceil(log2(a / 448))`` evaluated EXACTLY: with ``a = m * 2^E``,
      m in [1, 2), ``e = E - 8 + (m > 1.75)``. (TE computes ``a * (1/448)`` in f32 and rounds the
      exponent up; the two agree except when ``a`` is within one f32 ulp of ``448 * 2^k``.) No
      element ever saturates.
  Both are computed from the f32 bit pattern (never ``astype(float8_e8m0fnu)``, which rounds to
  nearest and maps 0 to NaN) and clamped to the E8M0 range [-127, 127] (biased byte 0..254).
  Elements: ``x * 2^-e`` (an exact power-of-two multiply: ``2^-e`` is always a normal f32), clipped
  to +-448, then cast to E4M3 round-to-nearest-even (``astype`` alone would turn 465 into NaN).
  Special values:
    * zero block (amax 0): ``e`` clamps to -127 (byte 0x00, the smallest E8M0 value; E8M0 has no
      zero), elements 0 -> dequantizes to exact zeros (as the OCP reference implementation does).
    * a block holding any NaN or +-Inf: scale byte 0xFF (E8M0 NaN) and every element NaN. OCP MX
      v1.0: "if the scale X is NaN, every element of the block decodes to NaN"; E4M3 has no Inf,
      so Inf cannot be kept and the whole block is marked NaN.
    * tiny blocks: ``e`` clamps at -127, small elements flush through E4M3's subnormals (2^-9
      step) to 0. Note XLA:CPU flushes f32 subnormals (FTZ/DAZ), so a dequantized value below
      2^-126 reads back as 0 on CPU.
  The division mode is irrelevant for MXFP8: the scale is a power of two, so ``x * 2^-e`` is exact.

NVFP4 (NVIDIA; TE / torchao rule): E2M1 elements, one E4M3 decode scale per 16, plus an f32
second-level scale, per tensor (``scaling="per_tensor"``, the original recipe) or per row =
per token for activations (``scaling="per_token"``, the report's variant; docs/SPEC.md §3).
  ``A`` = amax over the tensor (or the row) of the FINITE values;
  ``S_enc = 448 * 6 / A`` (1 if A == 0; clamped to the f32 max);
  block decode scale ``s_b = e4m3_rne(min(block_amax / 6 * S_enc, 448))``;
  element ``q = E2M1(x / (f32(s_b) / S_enc))``, clipped to +-6, rounded to nearest even
  (``rounding="rne"``) or stochastically (``rounding="stochastic"``, needs ``key``: rounds up to the
  next E2M1 neighbour with probability = the fractional distance, so E[q] = clip(x/scale));
  a block whose ``s_b`` rounds to 0 (it is negligible next to A) gets zero elements.
  Stored ``global_scale`` = the DECODE scale ``1 / S_enc`` (f32, correctly rounded), shape []
  (per tensor) or [..., 1] (per row). ``dequantize(q) = f32(q) * f32(s_b) * global_scale``.
  Special values: a block holding a NaN / Inf gets block scale E4M3 NaN (0x7F) and zero elements,
  so it dequantizes to NaN; it does not enter A (one Inf must not zero the whole tensor).
  ``division="ieee"``: the two divisions above are IEEE f32 (correctly rounded).
  ``division="approx"`` models the GPU fast path (``--use_fast_math``: ``a / b -> a * rcp(b)`` with
  ``rcp.approx``): every division ``a / b`` becomes ``a * approx_reciprocal(b)``:
      S_enc = 2688 * rcp(A);   s_b = e4m3(block_amax * rcp(6) * S_enc);   q = E2M1(x * (S_enc * rcp(f32(s_b))))
  where ``approx_reciprocal(b, bits)`` = the f32 reciprocal truncated toward zero to ``bits``
  mantissa bits (relative error in [0, 2^-bits), always low). The default
  ``APPROX_RCP_MANTISSA_BITS = 22`` bounds the error like ``rcp.approx.f32`` (~1-2 ulp) but with a
  consistent sign: the rounding of exact E2M1 ties (common for bf16-valued inputs) tips one way,
  which is the kind of systematic bias the report blames for divergence; fewer bits exaggerate it.

FP4 packing: two E2M1 codes per byte, element 2i in the LOW nibble, 2i+1 in the HIGH nibble (the
layout of ``jax.lax.bitcast_convert_type(float4[..., 2] -> uint8)`` and of PTX / torch ``float4_e2m1fn_x2``).
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, UInt8

MX_BLOCK = 32
NVFP4_BLOCK = 16
E4M3_MAX = 448.0
E2M1_MAX = 6.0
E4M3_EMAX = 8  # floor(log2(448))
E8M0_BIAS = 127
E8M0_NAN_BYTE = 255
E4M3_NAN_BYTE = 0x7F
APPROX_RCP_MANTISSA_BITS = 22
F32_MAX = 3.4028234663852886e38

SCALE_RULES = ("rceil", "floor")
SCALINGS = ("per_tensor", "per_token")
DIVISIONS = ("ieee", "approx")
ROUNDINGS = ("rne", "stochastic")


class MXTensor(NamedTuple):
    """MXFP8: ``values`` float8_e4m3fn [..., K], ``scales`` float8_e8m0fnu [..., K // block]."""

    values: Array
    scales: Array

    @property
    def block_size(self) -> int:
        return self.values.shape[-1] // self.scales.shape[-1]


class NVFP4Tensor(NamedTuple):
    """NVFP4: ``values`` float4_e2m1fn [..., K], ``block_scales`` float8_e4m3fn [..., K // block],
    ``global_scale`` float32 decode scale ``1/S_enc``: [] (per tensor) or [..., 1] (per row)."""

    values: Array
    block_scales: Array
    global_scale: Array

    @property
    def block_size(self) -> int:
        return self.values.shape[-1] // self.block_scales.shape[-1]


def check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    """Refuse a format option outside `allowed` (one-line ValueError naming it)."""
    if value not in allowed:
        raise ValueError(f"{name}={value!r}; expected one of {allowed}")


def _blocks(x: Array, block: int) -> Array:
    if x.ndim < 1:
        raise ValueError("quantize needs at least one axis (the contraction axis is the last)")
    K = x.shape[-1]
    if block <= 0 or K % block:
        raise ValueError(f"last (contraction) axis {K} must be a multiple of the block size {block}")
    return x.astype(jnp.float32).reshape(*x.shape[:-1], K // block, block)


def _f32_bits(x: Array) -> Array:
    return jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)


def _pow2(e: Array) -> Array:
    """2^e as f32 from bits, for integer e in [-126, 127] (normal range; exact)."""
    return jax.lax.bitcast_convert_type(((e + 127).astype(jnp.uint32) << 23), jnp.float32)


def mx_shared_exponent(amax: Float[Array, ...], *, scale_rule: str = "rceil") -> Array:
    """Unbiased E8M0 exponent (int32, clamped to [-127, 127]) for block amaxes (finite, >= 0)."""
    check_choice("scale_rule", scale_rule, SCALE_RULES)
    bits = _f32_bits(amax)
    field = ((bits >> 23) & 0xFF).astype(jnp.int32)  # 0 for zero / subnormal: floor(log2) <= -127
    e = field - 127 - E4M3_EMAX
    if scale_rule == "rceil":
        mant = bits & 0x7FFFFF
        e = e + (mant > 0x600000).astype(jnp.int32)  # mantissa m > 1.75 <=> a > 448 * 2^(E-8)
    return jnp.clip(e, -E8M0_BIAS, E8M0_BIAS)


def e8m0_from_exponent(e: Array) -> Array:
    """E8M0 from an unbiased int exponent in [-127, 127] (bit construction; never astype)."""
    return jax.lax.bitcast_convert_type((e + E8M0_BIAS).astype(jnp.uint8), jnp.float8_e8m0fnu)


@partial(jax.jit, static_argnames=("scale_rule", "block_size"))
def quantize_mxfp8(
    x: Float[Array, "*batch k"], *, scale_rule: str = "rceil", block_size: int = MX_BLOCK
) -> MXTensor:
    """MXFP8 quantization along the last axis (docs/SPEC.md §3; rules in the module docstring)."""
    xb = _blocks(x, block_size)
    finite = jnp.all(jnp.isfinite(xb), axis=-1, keepdims=True)
    amax = jnp.max(jnp.where(jnp.isfinite(xb), jnp.abs(xb), 0.0), axis=-1, keepdims=True)
    e = mx_shared_exponent(amax, scale_rule=scale_rule)  # [..., nb, 1]
    y = jnp.clip(xb * _pow2(-e), -E4M3_MAX, E4M3_MAX)  # -e in [-120, 127]: normal, exact
    vals = y.astype(jnp.float8_e4m3fn)
    nan8 = jax.lax.bitcast_convert_type(jnp.uint8(E4M3_NAN_BYTE), jnp.float8_e4m3fn)
    vals = jnp.where(finite, vals, nan8)
    byte = jnp.where(finite, (e + E8M0_BIAS), E8M0_NAN_BYTE).astype(jnp.uint8)
    scales = jax.lax.bitcast_convert_type(byte[..., 0], jnp.float8_e8m0fnu)
    return MXTensor(vals.reshape(x.shape), scales)


@partial(jax.jit, static_argnames=("dtype",))
def dequantize_mxfp8(q: MXTensor, dtype=jnp.float32) -> Float[Array, "*batch k"]:
    """``f32(values) * 2^e`` per block (byte 0xFF -> NaN), cast to ``dtype``."""
    B = q.block_size
    v = q.values.astype(jnp.float32).reshape(*q.scales.shape, B)
    s = q.scales.astype(jnp.float32)[..., None]  # exact (E8M0 -> f32 is a widening)
    return (v * s).reshape(q.values.shape).astype(dtype)


def approx_reciprocal(v: Array, mantissa_bits: int = APPROX_RCP_MANTISSA_BITS) -> Array:
    """Fast-path reciprocal model: f32 ``1/v`` truncated toward zero to ``mantissa_bits`` bits."""
    if not 1 <= mantissa_bits <= 23:
        raise ValueError(f"mantissa_bits={mantissa_bits} must be in [1, 23]")
    r = 1.0 / v.astype(jnp.float32)
    mask = jnp.uint32((0xFFFFFFFF << (23 - mantissa_bits)) & 0xFFFFFFFF)
    rt = jax.lax.bitcast_convert_type(_f32_bits(r) & mask, jnp.float32)
    return jnp.where(jnp.isfinite(r), rt, r)


def _div(a: Array, b: Array, division: str, bits: int) -> Array:
    return a / b if division == "ieee" else a * approx_reciprocal(b, bits)


_E2M1_STEP_EDGES = (2.0, 4.0)  # E2M1 grid: step 0.5 on [0, 2), 1 on [2, 4), 2 on [4, 6]


def _stochastic_e2m1(y: Array, key: Array) -> Array:
    """Stochastic rounding of |y| <= 6 onto the E2M1 grid (exact result, then a lossless cast)."""
    a = jnp.abs(y)
    step = jnp.where(a < _E2M1_STEP_EDGES[0], 0.5, jnp.where(a < _E2M1_STEP_EDGES[1], 1.0, 2.0))
    lo = jnp.floor(a / step) * step
    p = (a - lo) / step
    u = jax.random.uniform(key, y.shape, jnp.float32)
    r = jnp.minimum(jnp.where(u < p, lo + step, lo), E2M1_MAX)
    return jnp.sign(y) * r


@partial(jax.jit, static_argnames=("scaling", "division", "rounding", "block_size", "approx_bits"))
def quantize_nvfp4(
    x: Float[Array, "*batch k"],
    *,
    scaling: str = "per_token",
    division: str = "ieee",
    rounding: str = "rne",
    key: Array | None = None,
    block_size: int = NVFP4_BLOCK,
    approx_bits: int = APPROX_RCP_MANTISSA_BITS,
) -> NVFP4Tensor:
    """NVFP4 quantization along the last axis (docs/SPEC.md §3; rules in the module docstring)."""
    check_choice("scaling", scaling, SCALINGS)
    check_choice("division", division, DIVISIONS)
    check_choice("rounding", rounding, ROUNDINGS)
    if rounding == "stochastic" and key is None:
        raise ValueError("rounding='stochastic' needs an explicit PRNG key")
    xb = _blocks(x, block_size)  # [..., nb, B]
    fin_el = jnp.isfinite(xb)
    finite = jnp.all(fin_el, axis=-1, keepdims=True)
    absx = jnp.where(fin_el, jnp.abs(xb), 0.0)
    block_amax = jnp.max(absx, axis=-1, keepdims=True)  # [..., nb, 1]
    if scaling == "per_tensor":
        A = jnp.max(block_amax)
    else:
        A = jnp.max(block_amax, axis=(-2, -1), keepdims=True)  # [..., 1, 1]
    s_enc = jnp.minimum(_div(jnp.float32(E4M3_MAX * E2M1_MAX), A, division, approx_bits), F32_MAX)
    s_enc = jnp.where(A == 0, 1.0, s_enc)
    s_b = _div(block_amax, jnp.float32(E2M1_MAX), division, approx_bits) * s_enc
    s_b8 = jnp.minimum(s_b, E4M3_MAX).astype(jnp.float8_e4m3fn)
    s_bf = s_b8.astype(jnp.float32)
    if division == "ieee":
        y = xb / (s_bf / s_enc)
    else:
        y = xb * (s_enc * approx_reciprocal(s_bf, approx_bits))
    y = jnp.where((s_bf == 0) | ~fin_el, 0.0, y)
    y = jnp.clip(y, -E2M1_MAX, E2M1_MAX)
    if rounding == "stochastic":
        y = _stochastic_e2m1(y, key)
    vals = y.astype(jnp.float4_e2m1fn)
    nan8 = jax.lax.bitcast_convert_type(jnp.uint8(E4M3_NAN_BYTE), jnp.float8_e4m3fn)
    s_b8 = jnp.where(finite, s_b8, nan8)
    g = 1.0 / s_enc
    g = g if scaling == "per_tensor" else g[..., 0]  # [..., 1]
    return NVFP4Tensor(vals.reshape(x.shape), s_b8[..., 0], g.astype(jnp.float32))


@partial(jax.jit, static_argnames=("dtype",))
def dequantize_nvfp4(q: NVFP4Tensor, dtype=jnp.float32) -> Float[Array, "*batch k"]:
    """``f32(values) * f32(block_scale) * global_scale`` (the product of the first two is exact)."""
    B = q.block_size
    v = q.values.astype(jnp.float32).reshape(*q.block_scales.shape, B)
    s = q.block_scales.astype(jnp.float32)[..., None]
    out = (v * s).reshape(q.values.shape) * q.global_scale
    return out.astype(dtype)


def dequantize(q, dtype=jnp.float32):
    """Dequantize an `MXTensor` or `NVFP4Tensor`."""
    if isinstance(q, MXTensor):
        return dequantize_mxfp8(q, dtype)
    if isinstance(q, NVFP4Tensor):
        return dequantize_nvfp4(q, dtype)
    raise TypeError(f"expected MXTensor or NVFP4Tensor, got {type(q).__name__}")


def fp4_codes(values: Array) -> UInt8[Array, ...]:
    """4-bit E2M1 codes (sign bit 3, exponent bits 2-1, mantissa bit 0) as uint8."""
    if values.dtype != jnp.float4_e2m1fn:
        raise TypeError(f"expected float4_e2m1fn, got {values.dtype}")
    return jax.lax.bitcast_convert_type(values, jnp.uint4).astype(jnp.uint8)


def pack_fp4(values: Array) -> UInt8[Array, "*batch k2"]:
    """float4_e2m1fn [..., K] -> uint8 [..., K // 2]; element 2i -> low nibble, 2i+1 -> high nibble."""
    if values.shape[-1] % 2:
        raise ValueError(f"pack_fp4 needs an even last axis, got {values.shape[-1]}")
    c = fp4_codes(values)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_fp4(packed: UInt8[Array, "*batch k2"]) -> Array:
    """Inverse of `pack_fp4`: uint8 [..., K // 2] -> float4_e2m1fn [..., K]."""
    if packed.dtype != jnp.uint8:
        raise TypeError(f"expected uint8, got {packed.dtype}")
    lo, hi = packed & 0xF, packed >> 4
    codes = jnp.stack([lo, hi], axis=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
    return jax.lax.bitcast_convert_type(codes.astype(jnp.uint4), jnp.float4_e2m1fn)
