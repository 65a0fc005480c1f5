"""Block-scaled matmul references and the dispatcher (docs/SPEC.md §3; contract in docs/KERNELS.md).

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
from horizon.quant.grouped import grouped_matmul

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
    """Reference grouped GEMM: rows of group g use ``b[g]`` (dequantize, f32 grouped GEMM
    `horizon.quant.grouped.grouped_matmul` with `ragged_dot` semantics, epilogue)."""
    _check_pair(a, b)
    if a.values.ndim != 2 or b.values.ndim != 3:
        raise ValueError(f"expected a [T, K] and b [G, N, K], got {a.values.shape} and {b.values.shape}")
    G = b.values.shape[0]
    if group_sizes.shape != (G,):
        raise ValueError(f"group_sizes shape {group_sizes.shape} != ({G},)")
    va, sa, ga = _parts(a)
    vb, sb, gb = _parts(b)
    rhs = _block_dequant(vb, sb).transpose(0, 2, 1)  # [G, K, N]
    out = grouped_matmul(_block_dequant(va, sa).astype(jnp.float32), rhs.astype(jnp.float32), group_sizes,
                         precision=HIGHEST)
    if ga is not None:
        out = out * (ga if ga.ndim == 0 else ga.reshape(-1, 1))
        if gb.ndim == 0:
            out = out * gb
        else:  # per output row of each expert: gather the row's group (rows past the sum are 0 anyway)
            gid = jnp.minimum(group_ids(group_sizes, out.shape[0]), G - 1)
            out = out * gb.reshape(G, -1)[gid]
    return out.astype(out_dtype)


# ----------------------------------------------------------------------------------------------
# Dispatcher. Kernel packages plug in through the `horizon.quant_kernels` entry-point group
# (setup.cfg: pallas_kernels registers `pallas_kernels.dispatch:KERNELS`): horizon.quant never
# imports them, so there is no import cycle and a CPU install needs no kernel package.
# ----------------------------------------------------------------------------------------------
KERNELS_GROUP = "horizon.quant_kernels"


@functools.cache
def kernel_impl() -> tuple | None:
    """``(matmul_fn, grouped_fn, supported_fn)`` of the registered kernel package, or None when none
    is installed. A registered package that fails to import or lacks a function raises: a broken
    kernel module fails loudly instead of silently falling back to the reference.

    The entry point names a dict with ``blockscaled_matmul(a, b, *, out_dtype)``,
    ``grouped_blockscaled_matmul(a, b, group_sizes, *, out_dtype)`` and ``is_supported(a, b) -> bool``
    (a supported GPU and operand format)."""
    from importlib.metadata import entry_points  # noqa: PLC0415

    eps = list(entry_points(group=KERNELS_GROUP))
    if not eps:
        return None
    if len(eps) > 1:
        raise RuntimeError(f"several {KERNELS_GROUP} entry points installed: {[e.value for e in eps]}")
    fns = eps[0].load()
    names = ("blockscaled_matmul", "grouped_blockscaled_matmul", "is_supported")
    missing = [n for n in names if not callable(fns.get(n))]
    if missing:
        raise RuntimeError(f"kernel entry point {eps[0].value} lacks {missing}")
    return tuple(fns[n] for n in names)


@functools.cache
def _warn_fallback(reason: str) -> None:
    warnings.warn(f"blockscaled matmul: pallas requested but unavailable ({reason}); using the reference",
                  stacklevel=3)


def _route(impl: str, a, b) -> tuple | None:
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r}; expected one of {IMPLS}")
    if impl == "reference":
        return None
    fns = kernel_impl()
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
