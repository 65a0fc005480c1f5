"""Grouped expert GEMM at the FLOPs it needs (docs/SPEC.md §1: expert compute is a grouped GEMM, never a dense
all-experts computation).

``grouped_matmul(x [M, K], w [G, K, N], group_sizes [G])`` has `jax.lax.ragged_dot`'s semantics: rows
are sorted by group, rows ``[sum(gs[:g]), sum(gs[:g+1]))`` use ``w[g]``, rows past ``sum(gs)`` give 0
(the expert-parallel path relies on it: its empty receive slots sort last), empty groups are fine.

Why not `ragged_dot` everywhere: XLA:CPU expands it into a computation over every group (measured:
`cost_analysis()` of 2048 rows x [512 -> 256] x 32 groups is 1.73e10 FLOPs against the 5.4e8 a grouped
GEMM needs). The **block** implementation (MegaBlocks-style tiles) pads each group to a multiple of
``block`` rows in a static grid of ``(M + G * (block - 1)) // block`` tiles (each group wastes less
than one tile), gathers the rows into ``[tiles, block, K]`` and runs one ``[block, K] x [K, N]``
GEMM per tile with its group's weight, in a `lax.scan` over the tiles (the weight is sliced, not
copied per tile; consecutive tiles of one expert reuse it from cache). Outputs gather back to row
order. FLOPs: ``2 * tiles * block * K * N <= 2 * (M + G * block) * K * N``. The backward is a custom
VJP of the same tile loops: ``dx`` = the tile GEMM with ``w[g]^T``, ``dw[g]`` = the sum of
``x_tile^T dy_tile`` over g's tiles (`grouped_wgrad`, also the MXFP8 backward's wgrad).

Measured on 2 CPU cores (2048 rows, K=512, N=256, 32 groups, float32; `benchmarks/train_step.py`
reports the whole step): forward 10.7 ms, forward+backward 33.8 ms with block 32, against 8.7 /
17.8 ms for an equal-group batched matmul (the floor) and ~290 / ~1200 ms for `ragged_dot`; a variant
that gathers every tile's weight into one batched matmul was 31 / 51 ms (weight copies dominate). At
small sizes that variant wins (the loop's per-tile overhead dominates: a decode step's MoE, a tiny
model's training step), so it runs while the gathered weights fit `BATCHED_MAX_BYTES` (measured there).

FLOP accounting: XLA's `cost_analysis()` counts a loop body once, so under `count_flops()` (a
context) the tile loops trace as the same tile GEMMs in one batched product (the gathered-weight
variant above: identical products, only the schedule differs), for an exact compiled count (tests
and benchmarks use it; execution keeps the loop).

`IMPLS`/`choose_impl` is the one place the implementation is chosen ("ragged_dot" | "block"; per backend in
`AUTO_IMPL`, per model by `model.grouped_impl`): "block" on every backend. On an H200 the block forward of
one DeepSeek-V3 MoE layer (16k tokens, 256 experts top-8, d 7168, f 2048, bf16) ran at 73 TFLOP/s; XLA's
`ragged_dot` there is not measured yet (docs/PERF.md "On a lent H200"); `block_rows` sizes the tile.
"""

from __future__ import annotations

import contextlib
import functools
import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

IMPLS = ("auto", "block", "ragged_dot")
MIN_BLOCK, MAX_BLOCK = 8, 128


def block_rows(rows: int, groups: int) -> int:
    """Tile rows for `rows` routed rows over `groups` groups: the power of two nearest half the mean
    group size, clipped to [MIN_BLOCK, MAX_BLOCK] (measured best at 2048 x 32 groups: 32; smaller
    tiles cost loop steps, larger ones padding, < one tile per group)."""
    target = max(rows / max(groups, 1) / 2.0, 1.0)
    return int(min(max(1 << round(math.log2(target)), MIN_BLOCK), MAX_BLOCK))


_UNROLL = [False]


@contextlib.contextmanager
def count_flops():
    """While active, traced tile loops become one batched product so `compiled.cost_analysis()` counts
    every tile (module docstring). Trace (lower) a fresh function inside it; execution is unaffected."""
    _UNROLL.append(True)
    try:
        yield
    finally:
        _UNROLL.pop()


# What "auto" means per backend (`jax.default_backend()`): measured, see the module docstring and
# docs/PERF.md ("Grouped expert GEMM on an H200"); a backend not listed gets "block".
AUTO_IMPL = {"cpu": "block", "gpu": "block"}

# Per backend, the largest gathered tile weights (``tiles * K * N`` elements, in bytes) for which the
# block GEMM runs as one batched product instead of a loop over tiles (module docstring): small tiles
# pay the loop's per-iteration overhead, large gathered weights the copies. On XLA:CPU
# (`benchmarks/grouped_gemm.py --dtype float32 --impls block:loop,block:batched`, loop vs batched from a
# decode step's MoE to 50 MiB of gathered weights: docs/PERF.md "Decode step and rollout engine") the
# batched product won up to ~3 MiB and lost from ~12 MiB. Not listed (GPU: the H200 number above is
# the loop's): always the loop.
BATCHED_MAX_BYTES = {"cpu": 4 << 20}


def choose_impl(impl: str = "auto") -> str:
    """The grouped-GEMM implementation: `impl`, or for "auto" this backend's `AUTO_IMPL` entry."""
    if impl not in IMPLS:
        raise ValueError(f"grouped matmul impl={impl!r}; expected one of {IMPLS}")
    return AUTO_IMPL.get(jax.default_backend(), "block") if impl == "auto" else impl


def tile_layout(group_sizes: Int[Array, " g"], rows: int, block: int):
    """The static tile grid: (src [tiles*block] row of each tile slot (`rows` = empty slot),
    tile_group [tiles] (G = unused tile), dest [rows] slot of each row (tiles*block = a row past
    ``sum(group_sizes)``))."""
    G = group_sizes.shape[0]
    tiles = max((rows + G * (block - 1)) // block, 1)       # sum_g ceil(gs_g / block) <= this
    gs = group_sizes.astype(jnp.int32)
    ptiles = -(-gs // block)                                  # tiles per group
    tile_end = jnp.cumsum(ptiles)
    tile_start = tile_end - ptiles
    start = jnp.cumsum(gs) - gs                               # first row of each group
    tile_group = jnp.searchsorted(tile_end, jnp.arange(tiles, dtype=jnp.int32), side="right",
                                  method="scan_unrolled").astype(jnp.int32)
    slot_tile = jnp.arange(tiles * block, dtype=jnp.int32) // block
    g = jnp.minimum(tile_group, G - 1)[slot_tile]
    off = (slot_tile - tile_start[g]) * block + jnp.arange(tiles * block, dtype=jnp.int32) % block
    valid = (tile_group[slot_tile] < G) & (off < gs[g])
    src = jnp.where(valid, start[g] + off, rows)
    r = jnp.arange(rows, dtype=jnp.int32)
    row_group = jnp.searchsorted(jnp.cumsum(gs), r, side="right", method="scan_unrolled").astype(jnp.int32)
    rg = jnp.minimum(row_group, G - 1)
    dest = jnp.where(row_group < G, tile_start[rg] * block + r - start[rg], tiles * block)
    return src, tile_group, dest


def _with_zero_row(a):
    """`a` with one zero row appended: the target of out-of-range indices (empty tile slots, rows past
    ``sum(group_sizes)``), so the gathers below need no bounds select."""
    return jnp.concatenate([a, jnp.zeros((1,) + a.shape[1:], a.dtype)])


def _to_tiles(a, src, tiles: int, block: int):
    return jnp.take(_with_zero_row(a), src, axis=0, mode="clip").reshape(tiles, block, a.shape[-1])


def _from_tiles(at, dest):
    return jnp.take(_with_zero_row(at.reshape(-1, at.shape[-1])), dest, axis=0, mode="clip")


def _batched(tiles: int, k: int, n: int, dtype) -> bool:
    """Run the tile products as one batched product: under `count_flops`, or when the gathered
    [tiles, k, n] weights (or per-tile wgrads) fit this backend's `BATCHED_MAX_BYTES`."""
    size = tiles * k * n * jnp.dtype(dtype).itemsize
    return _UNROLL[-1] or size <= BATCHED_MAX_BYTES.get(jax.default_backend(), 0)


def _tile_gemms(xt, w, tile_group, *, transpose: bool, precision, out_dtype):
    """Per tile ``xt[t] @ w[g_t]`` (``w[g_t]^T`` if `transpose`); 0 for unused tiles."""
    G = w.shape[0]

    def body(_, a):
        xb, g = a
        wg = jax.lax.dynamic_index_in_dim(w, jnp.minimum(g, G - 1), keepdims=False)
        y = jnp.matmul(xb, wg.T if transpose else wg, precision=precision, preferred_element_type=out_dtype)
        return None, jnp.where(g < G, y, jnp.zeros_like(y))

    # the same tile GEMMs as one batched product (gathered weights)
    if _batched(xt.shape[0], w.shape[1], w.shape[2], w.dtype):
        wt = jnp.take(_with_zero_row(w), tile_group, axis=0, mode="clip")
        return jnp.einsum("tbk,tnk->tbn" if transpose else "tbk,tkn->tbn", xt, wt, precision=precision,
                          preferred_element_type=out_dtype)
    return jax.lax.scan(body, None, (xt, tile_group))[1]


def _tile_wgrad(xt, dyt, tile_group, G: int, *, precision, out_dtype):
    """``dw[g] = sum over g's tiles of xt[t]^T dyt[t]`` ([G, K, N], accumulated in place)."""
    def body(dw, a):
        xb, dyb, g = a
        gg = jnp.minimum(g, G - 1)
        upd = jnp.matmul(xb.T, dyb, precision=precision, preferred_element_type=out_dtype)
        cur = jax.lax.dynamic_index_in_dim(dw, gg, keepdims=False)
        return jax.lax.dynamic_update_index_in_dim(dw, cur + jnp.where(g < G, upd, jnp.zeros_like(upd)), gg, 0), None

    if _batched(xt.shape[0], xt.shape[-1], dyt.shape[-1], out_dtype):  # one batched product + segment sum
        per_tile = jnp.einsum("tbk,tbn->tkn", xt, dyt, precision=precision, preferred_element_type=out_dtype)
        return jax.ops.segment_sum(per_tile, tile_group, num_segments=G, indices_are_sorted=True)
    # zeros typed like the inputs (inside shard_map they vary over the manual axes; the carry must too)
    z = jnp.zeros_like(xt[0, 0, 0], dtype=out_dtype) + jnp.zeros_like(dyt[0, 0, 0], dtype=out_dtype)
    dw = jnp.broadcast_to(z, (G, xt.shape[-1], dyt.shape[-1]))
    return jax.lax.scan(body, dw, (xt, dyt, tile_group))[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _block_gemm(x, w, group_sizes, block, precision):
    return _block_fwd(x, w, group_sizes, block, precision)[0]


def _block_fwd(x, w, group_sizes, block, precision):
    src, tile_group, dest = tile_layout(group_sizes, x.shape[0], block)
    xt = _to_tiles(x, src, tile_group.shape[0], block)
    acc = jnp.promote_types(x.dtype, w.dtype)
    yt = _tile_gemms(xt, w, tile_group, transpose=False, precision=precision, out_dtype=acc)
    return _from_tiles(yt, dest).astype(x.dtype), (xt, w, group_sizes, src, tile_group, dest)


def _block_bwd(block, precision, res, dy):
    xt, w, group_sizes, src, tile_group, dest = res
    acc = jnp.promote_types(dy.dtype, w.dtype)
    dyt = _to_tiles(dy, src, tile_group.shape[0], block)
    dx = _from_tiles(_tile_gemms(dyt, w, tile_group, transpose=True, precision=precision, out_dtype=acc), dest)
    dw = _tile_wgrad(xt, dyt, tile_group, w.shape[0], precision=precision, out_dtype=acc)
    return _match_vma(dx, xt).astype(xt.dtype), _match_vma(dw, w).astype(w.dtype), None


def _varying(a) -> set:
    """The manual mesh axes `a` varies over inside shard_map (jax 0.10: `manual_axis_type.varying`;
    earlier: `vma`); empty outside shard_map."""
    t = jax.typeof(a)
    mat = getattr(t, "manual_axis_type", None)
    return set(mat.varying) if mat is not None else set(getattr(t, "vma", ()) or ())


def _match_vma(grad, primal):
    """Inside shard_map a cotangent must vary over the primal's manual axes only: sum it over the
    others (what autodiff's transpose of the implicit broadcast would do), e.g. an expert weight that
    varies over ``expert`` gets its per-device wgrads summed over the data axes."""
    extra = tuple(sorted(_varying(grad) - _varying(primal)))
    return jax.lax.psum(grad, extra) if extra else grad


_block_gemm.defvjp(_block_fwd, _block_bwd)


def grouped_matmul_block(
    x: Float[Array, "m k"], w: Float[Array, "g k n"], group_sizes: Int[Array, " g"], *, block: int | None = None,
    precision=None,
) -> Float[Array, "m n"]:
    """The block grouped GEMM (module docstring); `block` defaults to `block_rows(M, G)`."""
    block = int(block or block_rows(x.shape[0], w.shape[0]))
    return _block_gemm(x, w, group_sizes.astype(jnp.int32), block, precision)


def grouped_matmul(
    x: Float[Array, "m k"], w: Float[Array, "g k n"], group_sizes: Int[Array, " g"], *, impl: str = "auto",
    block: int | None = None, precision=None,
) -> Float[Array, "m n"]:
    """``ragged_dot(x, w, group_sizes)`` by the implementation `choose_impl(impl)` picks."""
    if x.ndim != 2 or w.ndim != 3 or x.shape[1] != w.shape[1] or group_sizes.shape != (w.shape[0],):
        raise ValueError(f"grouped_matmul wants x [M, K], w [G, K, N], group_sizes [G]; got {x.shape}, {w.shape}, "
                         f"{group_sizes.shape}")
    if choose_impl(impl) == "ragged_dot":
        return jax.lax.ragged_dot(x, w, group_sizes.astype(jnp.int32), precision=precision)
    return grouped_matmul_block(x, w, group_sizes, block=block, precision=precision)


def grouped_wgrad(
    x: Float[Array, "m k"], dy: Float[Array, "m n"], group_sizes: Int[Array, " g"], *, block: int | None = None,
    precision=None,
) -> Float[Array, "g k n"]:
    """``dw[g] = x_g^T dy_g`` over each group's rows (a contraction over ragged token groups; rows past
    ``sum(group_sizes)`` ignored): the block backward's wgrad on the tile grid."""
    M, G = x.shape[0], group_sizes.shape[0]
    block = int(block or block_rows(M, G))
    src, tile_group, _ = tile_layout(group_sizes.astype(jnp.int32), M, block)
    T = tile_group.shape[0]
    return _tile_wgrad(_to_tiles(x, src, T, block), _to_tiles(dy, src, T, block), tile_group, G,
                       precision=precision, out_dtype=jnp.promote_types(x.dtype, dy.dtype))
