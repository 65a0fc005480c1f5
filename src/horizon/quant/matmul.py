"""Block-scaled matmul references and the dispatcher (SPEC §3; contract in notes/QUANT_CONTRACT.md).

Layouts are K-major: ``a`` [M, K] (rows = tokens), ``b`` [N, K] (rows = output features),
``out = a @ b.T`` [M, N]. Grouped: ``a`` [T, K] sorted by group, ``b`` [G, N, K], ``group_sizes``
int32 [G] (sum <= T; rows past the sum give 0), ``out`` [T, N].

Two reference forms, which define correctness for the kernels in ``pallas_kernels/``:
  * ``mode="dequant"``: dequantize both operands to f32 (block scales folded in, exact), one f32 dot.
  * ``mode="per_block_accumulate"``: what a block-scaled tensor core does: for each K block (the
    operands' common block size), an unscaled f32 dot of the raw element values, then
    ``acc += partial * scale_a[:, kb, None] * scale_b[None, :, kb]``.
  NVFP4's f32 global scales are constant along K, so both forms apply them in the epilogue:
  ``out *= ga * gb`` (scalars, or ``ga`` [M, 1] per token and ``gb`` [N, 1] per output row).
  The two forms agree to f32 rounding (summation order), not bit for bit.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from horizon.quant.formats import MXTensor, NVFP4Tensor

HIGHEST = jax.lax.Precision.HIGHEST
MODES = ("dequant", "per_block_accumulate")
IMPLS = ("auto", "reference", "pallas")


def _parts(q) -> tuple[Array, Array, Array | None]:
    """(element values f32 [..., K], block scales f32 [..., K//B], global decode scale or None)."""
    if isinstance(q, MXTensor):
        return q.values.astype(jnp.float32), q.scales.astype(jnp.float32), None
    if isinstance(q, NVFP4Tensor):
        return q.values.astype(jnp.float32), q.block_scales.astype(jnp.float32), q.global_scale
    raise TypeError(f"expected MXTensor or NVFP4Tensor, got {type(q).__name__}")


def _check_pair(a, b) -> None:
    if type(a) is not type(b):
        raise TypeError(f"operands must share a format, got {type(a).__name__} and {type(b).__name__}")
    if a.values.shape[-1] != b.values.shape[-1]:
        raise ValueError(f"contraction mismatch: a K={a.values.shape[-1]}, b K={b.values.shape[-1]}")
    if a.block_size != b.block_size:
        raise ValueError(f"block sizes differ: {a.block_size} vs {b.block_size}")


def _block_dequant(v: Array, s: Array) -> Array:
    nb = s.shape[-1]
    return (v.reshape(*s.shape, v.shape[-1] // nb) * s[..., None]).reshape(v.shape)


@functools.partial(jax.jit, static_argnames=("out_dtype", "mode"))
def blockscaled_matmul_reference(
    a, b, *, out_dtype=jnp.float32, mode: str = "dequant"
) -> Float[Array, "m n"]:
    """Reference ``a @ b.T`` for block-scaled a [M, K], b [N, K] (module docstring)."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; expected one of {MODES}")
    _check_pair(a, b)
    if a.values.ndim != 2 or b.values.ndim != 2:
        raise ValueError(f"expected a [M, K] and b [N, K], got {a.values.shape} and {b.values.shape}")
    va, sa, ga = _parts(a)
    vb, sb, gb = _parts(b)
    if mode == "dequant":
        out = jnp.dot(_block_dequant(va, sa), _block_dequant(vb, sb).T, precision=HIGHEST)
    else:
        M, K = va.shape
        N = vb.shape[0]
        nb, B = sa.shape[-1], K // sa.shape[-1]
        ab = va.reshape(M, nb, B).transpose(1, 0, 2)  # [nb, M, B]
        bb = vb.reshape(N, nb, B).transpose(1, 0, 2)

        def step(acc, blk):
            x, y, s_a, s_b = blk
            partial = jnp.dot(x, y.T, precision=HIGHEST)  # unscaled MMA into a fresh accumulator
            return acc + partial * s_a[:, None] * s_b[None, :], None

        out, _ = jax.lax.scan(step, jnp.zeros((M, N), jnp.float32), (ab, bb, sa.T, sb.T))
    if ga is not None:
        out = out * (ga if ga.ndim == 0 else ga.reshape(-1, 1))
        out = out * (gb if gb.ndim == 0 else gb.reshape(1, -1))
    return out.astype(out_dtype)


def group_ids(group_sizes: Int[Array, " g"], rows: int) -> Int[Array, " t"]:
    """Group index of each sorted row (``G`` for rows past ``sum(group_sizes)``)."""
    ends = jnp.cumsum(group_sizes.astype(jnp.int32))
    return jnp.searchsorted(ends, jnp.arange(rows, dtype=jnp.int32), side="right").astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("out_dtype",))
def grouped_blockscaled_matmul_reference(
    a, b, group_sizes: Int[Array, " g"], *, out_dtype=jnp.float32
) -> Float[Array, "t n"]:
    """Reference grouped GEMM: rows of group g use ``b[g]`` (dequantize, f32 `ragged_dot`, epilogue)."""
    _check_pair(a, b)
    if a.values.ndim != 2 or b.values.ndim != 3:
        raise ValueError(f"expected a [T, K] and b [G, N, K], got {a.values.shape} and {b.values.shape}")
    G = b.values.shape[0]
    if group_sizes.shape != (G,):
        raise ValueError(f"group_sizes shape {group_sizes.shape} != ({G},)")
    va, sa, ga = _parts(a)
    vb, sb, gb = _parts(b)
    rhs = _block_dequant(vb, sb).transpose(0, 2, 1)  # [G, K, N] as ragged_dot wants
    out = jax.lax.ragged_dot(_block_dequant(va, sa), rhs, group_sizes.astype(jnp.int32),
                             precision=HIGHEST, preferred_element_type=jnp.float32)
    if ga is not None:
        out = out * (ga if ga.ndim == 0 else ga.reshape(-1, 1))
        if gb.ndim == 0:
            out = out * gb
        else:  # per output row of each expert: gather the row's group (rows past the sum are 0 anyway)
            gid = jnp.minimum(group_ids(group_sizes, out.shape[0]), G - 1)
            out = out * gb.reshape(G, -1)[gid]
    return out.astype(out_dtype)


# ----------------------------------------------------------------------------------------------
# Dispatcher. KERNELS HOOK: `_pallas_impl()` is where pallas_kernels plugs in (KERNELS helper).
# ----------------------------------------------------------------------------------------------


@functools.cache
def _pallas_impl():
    """KERNELS HOOK: return ``(matmul_fn, grouped_fn, supported_fn)`` from pallas_kernels, or None.

    Imported lazily so horizon.quant never needs pallas_kernels (or a GPU). Expected (to be wired by
    the KERNELS helper): ``pallas_kernels.blockscaled_matmul(a, b, *, out_dtype)``,
    ``pallas_kernels.grouped_blockscaled_matmul(a, b, group_sizes, *, out_dtype)`` and
    ``pallas_kernels.is_supported(a, b) -> bool`` (a supported GPU and operand format).
    """
    try:
        import pallas_kernels as pk  # noqa: PLC0415
    except Exception:  # noqa: BLE001 -- any import failure means "no kernels"
        return None
    fns = tuple(getattr(pk, n, None) for n in ("blockscaled_matmul", "grouped_blockscaled_matmul", "is_supported"))
    return fns if all(f is not None for f in fns) else None


@functools.cache
def _warn_fallback(reason: str) -> None:
    warnings.warn(f"blockscaled matmul: pallas requested but unavailable ({reason}); using the reference",
                  stacklevel=3)


def _route(impl: str, a, b) -> tuple | None:
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r}; expected one of {IMPLS}")
    if impl == "reference":
        return None
    fns = _pallas_impl()
    if fns is None:
        if impl == "pallas":
            _warn_fallback("pallas_kernels does not provide the kernels")
        return None
    if not fns[2](a, b):
        if impl == "pallas":
            _warn_fallback("no supported GPU / format")
        return None
    return fns


def blockscaled_matmul(a, b, *, out_dtype=jnp.float32, impl: str = "auto") -> Float[Array, "m n"]:
    """``a @ b.T`` for block-scaled operands: Pallas kernel when available, else the reference."""
    fns = _route(impl, a, b)
    if fns is None:
        return blockscaled_matmul_reference(a, b, out_dtype=out_dtype)
    return fns[0](a, b, out_dtype=out_dtype)


def grouped_blockscaled_matmul(a, b, group_sizes, *, out_dtype=jnp.float32, impl: str = "auto"):
    """Grouped block-scaled GEMM (see `grouped_blockscaled_matmul_reference`) with kernel dispatch."""
    fns = _route(impl, a, b)
    if fns is None:
        return grouped_blockscaled_matmul_reference(a, b, group_sizes, out_dtype=out_dtype)
    return fns[1](a, b, group_sizes, out_dtype=out_dtype)
