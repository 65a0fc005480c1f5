"""Quantized MoE grouped GEMM with a custom VJP: NVFP4 / MXFP8 forward, MXFP8 backward (docs/SPEC.md §3).

``quantized_ragged_dot(x [T, K], w [G, K, N], group_sizes [G], *, precision)`` has the semantics of
``jax.lax.ragged_dot(x, w, group_sizes)`` (rows sorted by group; rows past ``sum(group_sizes)`` give 0).

Precisions (every quantizer is straight-through: the backward treats it as the identity):
  * ``"bf16"``: no quantization (the grouped GEMM `horizon.quant.grouped.grouped_matmul` in x's dtype;
    autodiff backward).
  * ``"mxfp8"``: forward MXFP8 (x along K; w along K, per expert), backward MXFP8.
  * ``"nvfp4"``: forward NVFP4 with PER-TENSOR f32 scales (the original recipe's scaling: one scale for
    x, one for the stacked w), backward MXFP8. Only the forward scaling differs from the report's
    recipe below, so this pair isolates per-tensor vs per-token for the ablation. (The original
    NVIDIA recipe also runs its backward in NVFP4 with RHT and stochastic rounding; not modelled.)
  * ``"nvfp4_per_token_fwd_mxfp8_bwd"`` (the report's recipe): forward NVFP4 with a PER-TOKEN f32
    scale for x (one per row) and a per-output-row f32 scale for the weights (each expert's
    ``w[g, :, n]`` column = row n of the K-major B operand), backward MXFP8.
  Forward operands are quantized along the forward contraction axis K (x rows; w as B [G, N, K]).

MXFP8 backward: each GEMM's operands are re-quantized from the saved high-precision x, w (not the
forward's quantized copies) along THAT GEMM's own contraction axis, rule ``scale_rule``:
  * dgrad ``dx = dy @ w[g].T`` contracts over N: dy [T, N] blocks of 32 along N; w [G, K, N] blocks
    of 32 along N (it is already the K-major B operand [G, K_out, N]).
  * wgrad ``dw[g] = x_g.T @ dy_g`` contracts over the tokens of group g. Ragged groups are handled in a
    padded layout: every group's rows are moved to a start that is a multiple of 32 (static length
    ``round_up(T + G * 31, 32)``, zero padding), so each 32-token scale block lies inside one group
    and padding never enters a block amax; x.T [K, Tpad] and dy.T [N, Tpad] are quantized along
    tokens and contracted group by group (`horizon.quant.grouped.grouped_wgrad`: per-tile
    ``x_tile^T dy_tile`` summed per group, FLOPs proportional to the tokens).
  Note: a wgrad block mixes 32 consecutive tokens of one expert, so its scale sees neighbouring
  tokens (unavoidable for a contraction over tokens; dw is a sum over tokens anyway).
Requirements: K % 32 == 0 (MXFP8) or K % 16 == 0 (NVFP4) and N % 32 == 0 (dgrad). Outputs keep x's
dtype; dw keeps w's dtype.

Debug hook: `set_debug_hook(fn)` makes the backward call ``fn(name, MXTensor)`` (through
`jax.debug.callback`, with concrete arrays) for each operand it quantized: "dgrad_dy", "dgrad_w",
"wgrad_x", "wgrad_dy" (the wgrad ones in the padded, transposed layout [K|N, Tpad]). Set it before
tracing; ``set_debug_hook(None)`` removes it. Tests use it to prove the backward sees MXFP8.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from horizon.quant import formats
from horizon.quant.grouped import grouped_matmul, grouped_wgrad
from horizon.quant.matmul import HIGHEST, group_ids, grouped_blockscaled_matmul

PRECISIONS = ("bf16", "mxfp8", "nvfp4", "nvfp4_per_token_fwd_mxfp8_bwd")
_FWD = {  # precision -> (format, activation scaling, weight scaling)
    "mxfp8": ("mxfp8", None, None),
    "nvfp4": ("nvfp4", "per_tensor", "per_tensor"),
    "nvfp4_per_token_fwd_mxfp8_bwd": ("nvfp4", "per_token", "per_token"),
}

_DEBUG_HOOK: Callable | None = None


def set_debug_hook(fn: Callable | None) -> None:
    """Install (or clear, with None) the backward-operand recorder (module docstring)."""
    global _DEBUG_HOOK
    _DEBUG_HOOK = fn


def _record(name: str, q: formats.MXTensor) -> None:
    hook = _DEBUG_HOOK
    if hook is not None:
        jax.debug.callback(lambda v, s: hook(name, formats.MXTensor(v, s)), q.values, q.scales)


def _quantize_fwd(x, w_bnk, precision, division, scale_rule, approx_bits):
    fmt, xs, ws = _FWD[precision]
    if fmt == "mxfp8":
        return (formats.quantize_mxfp8(x, scale_rule=scale_rule),
                formats.quantize_mxfp8(w_bnk, scale_rule=scale_rule))
    kw = dict(division=division, approx_bits=approx_bits)
    return (formats.quantize_nvfp4(x, scaling=xs, **kw), formats.quantize_nvfp4(w_bnk, scaling=ws, **kw))


def _forward(x, w, group_sizes, precision, division, scale_rule, approx_bits, impl):
    qa, qb = _quantize_fwd(x, jnp.swapaxes(w, 1, 2), precision, division, scale_rule, approx_bits)
    return grouped_blockscaled_matmul(qa, qb, group_sizes, out_dtype=x.dtype, impl=impl)


def padded_group_layout(group_sizes: Int[Array, " g"], rows: int, align: int = formats.MX_BLOCK):
    """Destination row of each sorted row in the 32-aligned padded layout, its length, padded sizes.

    Rows past ``sum(group_sizes)`` get destination ``tpad`` (out of range: dropped by scatters).
    """
    G = group_sizes.shape[0]
    gs = group_sizes.astype(jnp.int32)
    tpad = -(-(rows + G * (align - 1)) // align) * align
    padded = -(-gs // align) * align
    start = jnp.cumsum(gs) - gs
    pstart = jnp.cumsum(padded) - padded
    gid = group_ids(gs, rows)
    t = jnp.arange(rows, dtype=jnp.int32)
    g = jnp.minimum(gid, G - 1)
    dest = jnp.where(gid < G, t - start[g] + pstart[g], tpad)
    return dest, tpad, padded


def mxfp8_backward(x, w, group_sizes, dy, *, scale_rule: str = "rceil", impl: str = "auto"):
    """(dx [T, K], dw [G, K, N]) with both GEMMs in MXFP8 along their own contraction axes."""
    T, K = x.shape
    G, _, N = w.shape
    # dgrad: dx = dy @ w[g].T, contraction over N.
    q_dy = formats.quantize_mxfp8(dy, scale_rule=scale_rule)  # [T, N] along N
    q_w = formats.quantize_mxfp8(w, scale_rule=scale_rule)  # [G, K, N] along N = B [G, K_out, N]
    _record("dgrad_dy", q_dy)
    _record("dgrad_w", q_w)
    dx = grouped_blockscaled_matmul(q_dy, q_w, group_sizes, out_dtype=jnp.float32, impl=impl)
    # wgrad: dw[g] = x_g.T @ dy_g, contraction over the group's tokens (32-aligned padded layout).
    dest, tpad, padded = padded_group_layout(group_sizes, T)
    xp = jnp.zeros((tpad, K), jnp.float32).at[dest].set(x.astype(jnp.float32), mode="drop")
    dyp = jnp.zeros((tpad, N), jnp.float32).at[dest].set(dy.astype(jnp.float32), mode="drop")
    q_xt = formats.quantize_mxfp8(xp.T, scale_rule=scale_rule)  # [K, Tpad] along tokens
    q_dyt = formats.quantize_mxfp8(dyp.T, scale_rule=scale_rule)  # [N, Tpad]
    _record("wgrad_x", q_xt)
    _record("wgrad_dy", q_dyt)
    lhs = formats.dequantize_mxfp8(q_xt)
    rhs = formats.dequantize_mxfp8(q_dyt)
    dw = grouped_wgrad(lhs.T, rhs.T, padded, precision=HIGHEST)  # [G, K, N]
    return dx, dw


@partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def _qrd(x, w, group_sizes, precision, division, scale_rule, approx_bits, impl):
    return _forward(x, w, group_sizes, precision, division, scale_rule, approx_bits, impl)


def _qrd_fwd(x, w, group_sizes, precision, division, scale_rule, approx_bits, impl):
    out = _forward(x, w, group_sizes, precision, division, scale_rule, approx_bits, impl)
    return out, (x, w, group_sizes)


def _qrd_bwd(precision, division, scale_rule, approx_bits, impl, res, g):
    x, w, group_sizes = res
    dx, dw = mxfp8_backward(x, w, group_sizes, g, scale_rule=scale_rule, impl=impl)
    return dx.astype(x.dtype), dw.astype(w.dtype), None


_qrd.defvjp(_qrd_fwd, _qrd_bwd)


def quantized_ragged_dot(
    x: Float[Array, "t k"],
    w: Float[Array, "g k n"],
    group_sizes: Int[Array, " g"],
    *,
    precision: str,
    division: str = "ieee",
    scale_rule: str = "rceil",
    approx_bits: int = formats.APPROX_RCP_MANTISSA_BITS,
    impl: str = "auto",
) -> Float[Array, "t n"]:
    """Low-precision ``ragged_dot(x, w, group_sizes)`` per recipe ``precision`` (module docstring)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}; expected one of {PRECISIONS}")
    if x.ndim != 2 or w.ndim != 3 or x.shape[1] != w.shape[1]:
        raise ValueError(f"expected x [T, K] and w [G, K, N], got {x.shape} and {w.shape}")
    if group_sizes.shape != (w.shape[0],):
        raise ValueError(f"group_sizes shape {group_sizes.shape} != ({w.shape[0]},)")
    if precision == "bf16":
        return grouped_matmul(x, w.astype(x.dtype), group_sizes)
    K, N = w.shape[1], w.shape[2]
    kb = formats.MX_BLOCK if _FWD[precision][0] == "mxfp8" else formats.NVFP4_BLOCK
    if K % kb or N % formats.MX_BLOCK:
        raise ValueError(f"{precision}: K={K} must be a multiple of {kb} and N={N} of {formats.MX_BLOCK}")
    formats.check_choice("division", division, formats.DIVISIONS)
    formats.check_choice("scale_rule", scale_rule, formats.SCALE_RULES)
    return _qrd(x, w, group_sizes.astype(jnp.int32), precision, division, scale_rule, int(approx_bits), impl)
