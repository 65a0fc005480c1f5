"""Grouped (ragged, MoE) MXFP8 block-scaled matmul for Hopper in Pallas / Mosaic GPU (docs/SPEC.md §3).

out[T, N]: row t of A [T, K] (tokens sorted by group) times B[g(t)] [N, K]^T, where g(t) is the
group whose slice of `group_sizes` [G] holds row t. Rows past sum(group_sizes) are 0 (as
`horizon.quant.matmul.grouped_blockscaled_matmul_reference`). Zero-sized groups are allowed.

Tile schedule (the structure of JAX's `ragged_dot_mgpu.py`, computed here in the wrapper instead
of inside the kernel): every group covers the row tiles [start // tm, (end - 1) // tm]; a tile
that straddles a group boundary is visited once per group it touches, so there are at most
cdiv(T, tm) + G row-tile visits (the rows past the sum count as one extra "zero" group).
The wrapper builds an int32 table [4, cdiv(T, tm) + G] -- (group, tile row start, first row in
the tile, number of rows) -- with a few O(G + T/tm) XLA ops, so the kernel does no per-group
search (an unrolled search over G = 256 experts per tile would be slow to compile and run).
Unused visits have 0 rows and are skipped.

Per visit the K loop is the dense Hopper kernel's (`blockscaled_matmul_hopper.py`): TMA double
buffering of A rows, B[g] rows and their f32 scales; one fp8 wgmma per 32-wide MX block into a
fresh accumulator, then promotion `acc += sa[row] * sb[col] * partial`. The full 64-row A tile is
multiplied (rows of neighbouring groups included: wasted work on straddling tiles only), and the
epilogue stores only the visit's own rows, so visits of the same tile by different CTAs never
write the same rows. TMA needs static box sizes, so the partial-row store is a ladder of
power-of-two row stores (64, 32, ..., 1 rows) chosen by the bits of the row count, from an
unswizzled output SMEM tile (row slices at any offset are legal there). The "zero" group (rows
past the sum) runs no K loop and stores zeros.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from jaxtyping import Array, Float, Int

from pallas_kernels import _common as C
from pallas_kernels.blockscaled_matmul_hopper import MX_BLOCK, _tile_loop, auto_config, promoted_chunk

# Rows of the schedule table.
_GROUP, _ROW0, _START, _SIZE = range(4)


def tile_schedule(group_sizes: Int[Array, " g"], rows: int, tile_m: int) -> Int[Array, "4 v"]:
    """Row-tile visits for the ragged grid (module docstring): int32 [4, cdiv(rows, tile_m) + G].

    Column v: group id (G = the zero group for rows past the sum), first row of the tile, offset of
    the visit's first row inside the tile, number of rows (0 = unused visit).
    """
    g = group_sizes.shape[0]
    sizes = jnp.maximum(group_sizes.astype(jnp.int32), 0)
    ends = jnp.minimum(jnp.cumsum(sizes), rows)  # clamp: sum > rows is caller error, keep in bounds
    ends = jnp.concatenate([ends, jnp.array([rows], jnp.int32)])  # + zero group [sum, rows)
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
    nonempty = ends > starts
    first_tile = starts // tile_m
    last_tile = jnp.maximum(ends - 1, 0) // tile_m
    ntiles = jnp.where(nonempty, last_tile - first_tile + 1, 0)
    visit_end = jnp.cumsum(ntiles)
    visit_start = visit_end - ntiles
    num_visits = pl.cdiv(rows, tile_m) + g
    v = jnp.arange(num_visits, dtype=jnp.int32)
    grp = jnp.minimum(jnp.searchsorted(visit_end, v, side="right").astype(jnp.int32), g)
    tile = first_tile[grp] + v - visit_start[grp]
    row0 = tile * tile_m
    lo = jnp.maximum(starts[grp], row0)
    hi = jnp.minimum(ends[grp], row0 + tile_m)
    used = v < visit_end[-1]
    size = jnp.where(used, jnp.maximum(hi - lo, 0), 0)
    start = jnp.where(used, lo - row0, 0)
    row0 = jnp.where(used, row0, 0)
    return jnp.stack([grp, row0, start, size]).astype(jnp.int32)


def _grouped_kernel(sched_g, a_g, b_g, sa_g, sb_g, o_g, *, cfg: C.HopperConfig, num_groups: int,
                    num_visits: int, n_tiles: int, k_chunks: int, interpret: Any):
    tm, tn, tk = cfg.tile_m, cfg.tile_n, cfg.tile_k
    nsub = tk // MX_BLOCK
    in_tr = C.smem_transforms(MX_BLOCK, jnp.float8_e4m3fn)

    def scoped(a_s, b_s, sa_s, sb_s, o_s, bars):
        def visit(t):
            vi = t // n_tiles
            ni = t % n_tiles
            grp = sched_g[_GROUP, vi]
            row0 = sched_g[_ROW0, vi]
            start = sched_g[_START, vi]
            size = sched_g[_SIZE, vi]
            real = grp < num_groups
            gb = jnp.minimum(grp, num_groups - 1)  # in-bounds B index (the zero group loads nothing)
            trips = jnp.where(real, k_chunks, 0)

            def issue(kc, slot):
                ks = pl.ds(kc * tk, tk)
                kbs = pl.ds(kc * nsub, nsub)
                cols = pl.ds(ni * tn, tn)
                plgpu.copy_gmem_to_smem(a_g.at[pl.ds(row0, tm), ks], a_s.at[slot], bars.at[4 * slot + 0])
                plgpu.copy_gmem_to_smem(b_g.at[gb, cols, ks], b_s.at[slot], bars.at[4 * slot + 1])
                plgpu.copy_gmem_to_smem(sa_g.at[kbs, pl.ds(row0, tm)], sa_s.at[slot], bars.at[4 * slot + 2])
                plgpu.copy_gmem_to_smem(sb_g.at[gb, kbs, cols], sb_s.at[slot], bars.at[4 * slot + 3])

            def k_body(kc, acc):
                slot = kc % 2

                @pl.when(kc + 1 < trips)
                def _prefetch():
                    issue(kc + 1, 1 - slot)

                for i in range(4):
                    plgpu.barrier_wait(bars.at[4 * slot + i])
                return promoted_chunk(acc, a_s, b_s, sa_s, sb_s, slot, cfg=cfg, interpret=interpret)

            @pl.when(size > 0)
            def _run():
                @pl.when(real)
                def _first():
                    issue(0, 0)

                acc0 = C.with_layout(jnp.zeros((tm, tn), jnp.float32), plgpu.Layout.WGMMA, interpret)
                acc = lax.fori_loop(0, trips, k_body, acc0)
                plgpu.wait_smem_to_gmem(0)  # previous visit's stores have read o_s
                o_s[...] = acc.astype(o_s.dtype)
                plgpu.commit_smem()
                # Store rows [start, start + size) of the tile: power-of-two ladder (static TMA boxes).
                off = start
                p = tm
                while p >= 1:
                    @pl.when((size & p) != 0)
                    def _store(p=p, off=off):
                        plgpu.copy_smem_to_gmem(o_s.at[pl.ds(off, p)],
                                                o_g.at[pl.ds(row0 + off, p), pl.ds(ni * tn, tn)])
                    off = off + (size & p)
                    p //= 2

        _tile_loop(num_visits * n_tiles, visit)
        plgpu.wait_smem_to_gmem(0)

    pl.run_scoped(
        scoped,
        plgpu.SMEM((2, tm, tk), jnp.float8_e4m3fn, transforms=in_tr),
        plgpu.SMEM((2, tn, tk), jnp.float8_e4m3fn, transforms=in_tr),
        plgpu.SMEM((2, nsub, tm), jnp.float32),
        plgpu.SMEM((2, nsub, tn), jnp.float32),
        plgpu.SMEM((tm, tn), o_g.dtype),  # unswizzled: row slices at any offset for the store ladder
        plgpu.Barrier(num_barriers=8),
    )


def grouped_mxfp8_matmul_from_parts(
    a_values: Float[Array, "t k"],
    a_scales: Array,
    b_values: Float[Array, "g n k"],
    b_scales: Array,
    group_sizes: Int[Array, " g"],
    *,
    out_dtype: Any = jnp.float32,
    config: C.HopperConfig | None = None,
    num_sms: int = C.H100_SMS,
    interpret: Any = None,
) -> Float[Array, "t n"]:
    """Grouped MXFP8 GEMM on Hopper (docs/SPEC.md §3): e4m3 A [T,K], B [G,N,K]; e8m0 scales [.., K/32].

    T need not be a multiple of tile_m (A is zero-padded to the next tile in the wrapper).
    """

    t, k = a_values.shape
    if b_values.ndim != 3:
        raise ValueError(f"B must be [G, N, K], got {b_values.shape}")
    g, n, k2 = b_values.shape
    if k != k2:
        raise ValueError(f"K mismatch: A {a_values.shape} vs B {b_values.shape}")
    if group_sizes.shape != (g,):
        raise ValueError(f"group_sizes shape {group_sizes.shape} != ({g},)")
    if a_values.dtype != jnp.float8_e4m3fn or b_values.dtype != jnp.float8_e4m3fn:
        raise ValueError(f"MXFP8 values must be float8_e4m3fn, got {a_values.dtype}, {b_values.dtype}")
    if a_scales.shape != (t, k // MX_BLOCK) or b_scales.shape != (g, n, k // MX_BLOCK):
        raise ValueError(f"scale shapes {a_scales.shape}, {b_scales.shape} do not match K/32={k // MX_BLOCK}")
    cfg = config or auto_config(64, n, k)
    cfg.check()
    if cfg.tile_k % MX_BLOCK:
        raise ValueError(f"tile_k={cfg.tile_k} must be a multiple of {MX_BLOCK}")
    C.check_divisible("N", n, cfg.tile_n)
    C.check_divisible("K", k, cfg.tile_k)
    tm = cfg.tile_m
    tp = pl.cdiv(t, tm) * tm
    sa = C.e8m0_to_f32(a_scales).T  # [K/32, T]
    sb = jnp.swapaxes(C.e8m0_to_f32(b_scales), 1, 2)  # [G, K/32, N]
    av = a_values
    if tp != t:  # pad rows to whole tiles (padded rows belong to the zero group: never stored)
        av = jnp.pad(av, ((0, tp - t), (0, 0)))
        sa = jnp.pad(sa, ((0, 0), (0, tp - t)))
    sched = tile_schedule(group_sizes, t, tm)
    num_visits = sched.shape[1]
    n_tiles, k_chunks = n // cfg.tile_n, k // cfg.tile_k
    kern = functools.partial(_grouped_kernel, cfg=cfg, num_groups=g, num_visits=num_visits,
                             n_tiles=n_tiles, k_chunks=k_chunks, interpret=interpret)
    # Lane semantics, as on jax 0.10 (its default): jax 0.11's default, Warpgroup, runs a layout inference
    # that cannot place the epilogue's row slices at schedule-given offsets ("prove the divisibility of
    # index 0 using pl.multiple_of"; seen on an H200, docs/KERNELS.md).
    params = None if C.is_interpret(interpret) else plgpu.CompilerParams(
        lowering_semantics=plgpu.LoweringSemantics.Lane)
    f = plgpu.kernel(
        kern,
        out_type=jax.ShapeDtypeStruct((t, n), out_dtype),
        grid=(min(num_sms, num_visits * n_tiles),),
        grid_names=("sm",),
        compiler_params=params,
        interpret=interpret,
    )
    return f(sched, av, b_values, sa, sb)
