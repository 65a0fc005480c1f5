"""Blackwell (sm_100a) block-scaled matmul in Pallas / Mosaic GPU with tcgen05 (docs/SPEC.md §3).

out[M, N] = A[M, K] @ B[N, K]^T, both K-major (FP4 requires it), f32 accumulator in TMEM.

Formats (both operands alike):
  * MXFP8: float8_e4m3fn values, float8_e8m0fnu scale per 32 K-elements;
  * NVFP4: float4_e2m1fn values, float8_e4m3fn scale per 16 K-elements, plus the f32 second-level
    decode scale (per row = per token, or per tensor), which is constant along K and is applied
    in the epilogue: out = acc * ga[row] * gb[col].
The tensor core applies the block scales itself (`tcgen05.mma` block-scaled kinds), reading them
from TMEM (`plgpu.TMEM(..., layout=TMEMLayout.SCALES_LAYOUT)`), where `async_copy_scales_to_tmem`
puts them from SMEM. That copy wants each 128-row tile's scales pre-swizzled in GMEM as
(MN/128, KB/4, 32, 16) (KB = K / block; `swizzle_scales`), so one TMA box per K step
lands them contiguously in SMEM.

Structure (one 128 x tile_n output tile per CTA, one warpgroup):
  * warp 0 issues TMA loads of A, B and both scale tiles into a ring of `stages` SMEM slots,
    waiting on the slot's "consumed" barrier before refilling it;
  * warp 1 waits for a slot, copies its scales SMEM -> TMEM (slot's own TMEM columns) and issues
    the block-scaled tcgen05_mma into the TMEM accumulator; the MMA's completion arrives on the
    slot's "consumed" barrier (tensor-core ordered), and after the last K step a commit arrives
    on the "done" barrier;
  * the whole warpgroup then loads the accumulator from TMEM, applies the per-row / per-column
    f32 scales (NVFP4), casts (f32 or bf16) and stores via SMEM + TMA.
TMA and MMA overlap across K steps (stages-deep ring). Not done: persistent grid with
double-buffered accumulators (epilogue/MMA overlap), 2-CTA collective MMA, cluster multicast.

Verification: tcgen05 has no interpreter in jax 0.10.2, so this kernel is checked only by
lowering on CPU for sm_100a (`lowering_arch` context; see its docstring for how the target is
chosen) and by the swizzle helper's CPU test. Nothing here has run on a Blackwell GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from jaxtyping import Array, Float

SCALE_ROWS = 128  # rows of one scale tile (TMEM lanes)
SCALE_COLS = 4    # scale columns per TMEM scale-layout tile
MX_BLOCK = 32
NV_BLOCK = 16
TILE_M = 128      # 1-CTA block-scaled tcgen05 needs M = 128


def swizzle_scales(scales: Array) -> Array:
    """(MN, KB) block scales -> the tcgen05 scale layout (MN/128, KB/4, 32, 16) (docs/SPEC.md §3).

    out[i, j, r, 4 * q + c] = scales[128 * i + 32 * q + r, 4 * j + c]: within a 128-row tile, row
    r of each 32-row quarter q holds that quarter's 4 consecutive scale columns side by side
    (the PTX "scale factor A/B layout, 1X": the same 128x4 blocking as cuBLAS / cuDNN's).
    MN is zero-padded to a multiple of 128; KB must be a multiple of 4.
    """
    mn, kb = scales.shape
    if kb % SCALE_COLS:
        raise ValueError(f"scale columns K/block={kb} must be a multiple of {SCALE_COLS}")
    pad = -mn % SCALE_ROWS
    if pad:
        scales = jnp.concatenate([scales, jnp.zeros((pad, kb), scales.dtype)], axis=0)
    tiles = scales.shape[0] // SCALE_ROWS
    # axes: (tile i, quarter q, row r, column group j, column c) -> (i, j, r, q, c)
    s5 = scales.reshape(tiles, 4, 32, kb // SCALE_COLS, SCALE_COLS)
    return jnp.transpose(s5, (0, 3, 2, 1, 4)).reshape(tiles, kb // SCALE_COLS, 32, 4 * SCALE_COLS)


@dataclasses.dataclass(frozen=True)
class BlackwellConfig:
    """Tiling (docs/SPEC.md §3). tile_n: 8..256, multiple of 8 (MMA N); tile_k: K elements per stage
    (a multiple of 4 scale blocks: 128 for MXFP8, 64 for NVFP4); stages: TMA ring depth."""

    tile_n: int = 128
    tile_k: int = 128
    stages: int = 3

    def check(self, block: int) -> None:
        if self.tile_n % 8 or not 8 <= self.tile_n <= 256:
            raise ValueError(f"tile_n={self.tile_n} must be a multiple of 8 in [8, 256]")
        if self.tile_k % (SCALE_COLS * block):
            raise ValueError(f"tile_k={self.tile_k} must be a multiple of {SCALE_COLS * block}")
        if self.stages < 1:
            raise ValueError(f"stages={self.stages} must be >= 1")


def _swizzled_transforms(minor_elems: int, bits: int) -> tuple[Any, ...]:
    swizzle = plgpu.find_swizzle(minor_elems * bits)
    return (plgpu.TilingTransform((8, swizzle * 8 // bits)), plgpu.SwizzleTransform(swizzle))


def _kernel(a_g, b_g, sa_g, sb_g, *rest, cfg: BlackwellConfig, block: int, n_tiles: int, k_chunks: int,
            has_global: bool):
    if has_global:
        ga_g, gb_g, o_g, *scratch = rest
    else:
        (o_g, *scratch), ga_g, gb_g = rest, None, None
    (a_s, b_s, sa_s, sb_s, o_s, g_s, acc_t, sa_t, sb_t, load_bar, free_bar, done_bar, g_bar) = scratch
    tn, tk, stages = cfg.tile_n, cfg.tile_k, cfg.stages
    kq = tk // block // SCALE_COLS  # scale column groups per K step
    kb = tk // block                # scale columns per K step
    t = lax.axis_index("tile")
    mi, ni = lax.div(t, n_tiles), lax.rem(t, n_tiles)  # lax ops: `//` is a jitted jnp fn (no warp rule)
    rows, cols = pl.ds(mi * TILE_M, TILE_M), pl.ds(ni * tn, tn)

    @pl.core_map(plgpu.WarpMesh(axis_name="warp"))
    def _warps():
        warp = lax.axis_index("warp")

        @pl.when(warp == 0)
        def _producer():
            def body(kc, carry):
                slot = lax.rem(kc, stages)

                @pl.when(kc >= stages)
                def _():
                    plgpu.barrier_wait(free_bar.at[slot])  # the MMA that read this slot is done

                ks, kqs = pl.ds(kc * tk, tk), pl.ds(kc * kq, kq)
                plgpu.copy_gmem_to_smem(a_g.at[rows, ks], a_s.at[slot], load_bar.at[slot])
                plgpu.copy_gmem_to_smem(b_g.at[cols, ks], b_s.at[slot], load_bar.at[slot])
                plgpu.copy_gmem_to_smem(sa_g.at[pl.ds(mi, 1), kqs], sa_s.at[slot], load_bar.at[slot])
                plgpu.copy_gmem_to_smem(sb_g.at[pl.ds(ni * (tn // SCALE_ROWS), tn // SCALE_ROWS), kqs],
                                        sb_s.at[slot], load_bar.at[slot])
                return carry

            lax.fori_loop(0, k_chunks, body, None)

        @pl.when(warp == 1)
        def _mma():
            def body(kc, carry):
                slot = lax.rem(kc, stages)
                plgpu.barrier_wait(load_bar.at[slot])
                sa_slot = sa_t.at[:, pl.ds(slot * kb, kb)]
                sb_slot = sb_t.at[:, pl.ds(slot * kb, kb)]
                # Same-thread tcgen05 copy -> MMA needs no wait (the MMA is ordered after it).
                plgpu.async_copy_scales_to_tmem(sa_s.at[slot], sa_slot)
                plgpu.async_copy_scales_to_tmem(sb_s.at[slot], sb_slot)
                plgpu.tcgen05_mma(acc_t, a_s.at[slot], plgpu.transpose_ref(b_s.at[slot], (1, 0)),
                                  free_bar.at[slot], a_scale=sa_slot, b_scale=sb_slot, accumulate=kc > 0)

                @pl.when(kc == k_chunks - 1)
                def _():
                    plgpu.tcgen05_commit_arrive(done_bar)

                return carry

            lax.fori_loop(0, k_chunks, body, None)

    if has_global:
        plgpu.copy_gmem_to_smem(ga_g.at[rows], g_s.at[0, pl.ds(0, TILE_M)], g_bar)
        plgpu.copy_gmem_to_smem(gb_g.at[cols], g_s.at[1, pl.ds(0, tn)], g_bar)
    plgpu.barrier_wait(done_bar)
    acc = plgpu.async_load_tmem(acc_t, layout=plgpu.Layout.TCGEN05)
    plgpu.wait_load_tmem()
    if has_global:
        plgpu.barrier_wait(g_bar)
        # Register layouts of the row / column vectors must match the accumulator's (TCGEN05).
        ga = plgpu.load(g_s, (0, pl.ds(0, TILE_M)), layout=plgpu.Layout.TCGEN05.reduce(1))
        gb = plgpu.load(g_s, (1, pl.ds(0, tn)), layout=plgpu.Layout.TCGEN05.reduce(0))
        lay = plgpu.Layout.TCGEN05  # layout_cast = hint for the broadcast (else it picks WGMMA's)
        acc = acc * plgpu.layout_cast(lax.broadcast_in_dim(ga, (TILE_M, tn), (0,)), lay)
        acc = acc * plgpu.layout_cast(lax.broadcast_in_dim(gb, (TILE_M, tn), (1,)), lay)
    o_s[...] = acc.astype(o_s.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_s, o_g.at[rows, cols])
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def _blockscaled_call(a_values, b_values, sa, sb, ga, gb, *, block: int, out_dtype: Any,
                      config: BlackwellConfig) -> Array:
    m, k = a_values.shape
    n, k2 = b_values.shape
    if k != k2:
        raise ValueError(f"K mismatch: A {a_values.shape} vs B {b_values.shape}")
    cfg = config
    cfg.check(block)
    if m % TILE_M:
        raise ValueError(f"M={m} must be a multiple of {TILE_M}")
    if n % cfg.tile_n or cfg.tile_n % SCALE_ROWS:
        raise ValueError(f"N={n} must be a multiple of tile_n={cfg.tile_n}, itself a multiple of {SCALE_ROWS}")
    if k % cfg.tile_k:
        raise ValueError(f"K={k} must be a multiple of tile_k={cfg.tile_k}")
    if sa.shape != (m, k // block) or sb.shape != (n, k // block):
        raise ValueError(f"scale shapes {sa.shape}, {sb.shape} do not match K/{block}={k // block}")
    tn, tk, stages = cfg.tile_n, cfg.tile_k, cfg.stages
    bits = jnp.finfo(a_values.dtype).bits
    kq, kb = tk // block // SCALE_COLS, tk // block
    has_global = ga is not None
    n_tiles, k_chunks = n // tn, k // tk
    in_tr = _swizzled_transforms(tk, bits)
    out_tr = _swizzled_transforms(tn, jnp.finfo(out_dtype).bits)
    scratch = (  # order = _kernel's scratch unpacking
        plgpu.SMEM((stages, TILE_M, tk), a_values.dtype, transforms=in_tr),
        plgpu.SMEM((stages, tn, tk), b_values.dtype, transforms=in_tr),
        plgpu.SMEM((stages, 1, kq, 32, 16), sa.dtype),
        plgpu.SMEM((stages, tn // SCALE_ROWS, kq, 32, 16), sb.dtype),
        plgpu.SMEM((TILE_M, tn), out_dtype, transforms=out_tr),
        plgpu.SMEM((2, max(TILE_M, tn)), jnp.float32),
        plgpu.TMEM((TILE_M, tn), jnp.float32),
        plgpu.TMEM((TILE_M, stages * kb), sa.dtype, layout=plgpu.TMEMLayout.SCALES_LAYOUT),
        plgpu.TMEM((tn, stages * kb), sb.dtype, layout=plgpu.TMEMLayout.SCALES_LAYOUT),
        plgpu.Barrier(num_arrivals=4, num_barriers=stages),
        plgpu.Barrier(num_barriers=stages, orders_tensor_core=True),
        plgpu.Barrier(orders_tensor_core=True),
        plgpu.Barrier(num_arrivals=2),
    )
    kern = functools.partial(_kernel, cfg=cfg, block=block, n_tiles=n_tiles, k_chunks=k_chunks,
                             has_global=has_global)
    f = plgpu.kernel(
        kern,
        out_type=jax.ShapeDtypeStruct((m, n), out_dtype),
        grid=((m // TILE_M) * n_tiles,),
        grid_names=("tile",),
        scratch_types=scratch,
    )
    args = (a_values, b_values, swizzle_scales(sa), swizzle_scales(sb))
    if has_global:
        args += (ga, gb)
    return f(*args)


def mxfp8_matmul_from_parts(
    a_values: Float[Array, "m k"], a_scales: Array, b_values: Float[Array, "n k"], b_scales: Array, *,
    out_dtype: Any = jnp.float32, config: BlackwellConfig | None = None,
) -> Float[Array, "m n"]:
    """MXFP8 x MXFP8 on Blackwell (docs/SPEC.md §3): e4m3 values [M,K]/[N,K], e8m0 scales [.., K/32]."""
    if a_values.dtype != jnp.float8_e4m3fn or b_values.dtype != jnp.float8_e4m3fn:
        raise ValueError(f"MXFP8 values must be float8_e4m3fn, got {a_values.dtype}, {b_values.dtype}")
    if a_scales.dtype != jnp.float8_e8m0fnu or b_scales.dtype != jnp.float8_e8m0fnu:
        raise ValueError("MXFP8 scales must be float8_e8m0fnu")
    return _blockscaled_call(a_values, b_values, a_scales, b_scales, None, None, block=MX_BLOCK,
                             out_dtype=out_dtype, config=config or BlackwellConfig(128, 128, 3))


def nvfp4_matmul_from_parts(
    a_values: Float[Array, "m k"], a_block_scales: Array, a_global: Array,
    b_values: Float[Array, "n k"], b_block_scales: Array, b_global: Array, *,
    out_dtype: Any = jnp.float32, config: BlackwellConfig | None = None,
) -> Float[Array, "m n"]:
    """NVFP4 x NVFP4 on Blackwell (docs/SPEC.md §3): e2m1 values [M,K]/[N,K] (float4_e2m1fn, unpacked dtype),
    e4m3 block scales [.., K/16], f32 global decode scales per row ([.., 1]) or per tensor ([])."""
    if a_values.dtype != jnp.float4_e2m1fn or b_values.dtype != jnp.float4_e2m1fn:
        raise ValueError(f"NVFP4 values must be float4_e2m1fn, got {a_values.dtype}, {b_values.dtype}")
    if a_block_scales.dtype != jnp.float8_e4m3fn or b_block_scales.dtype != jnp.float8_e4m3fn:
        raise ValueError("NVFP4 block scales must be float8_e4m3fn")
    m, n = a_values.shape[0], b_values.shape[0]
    ga = jnp.broadcast_to(jnp.asarray(a_global, jnp.float32).reshape(-1), (m,))
    gb = jnp.broadcast_to(jnp.asarray(b_global, jnp.float32).reshape(-1), (n,))
    return _blockscaled_call(a_values, b_values, a_block_scales, b_block_scales, ga, gb, block=NV_BLOCK,
                             out_dtype=out_dtype, config=config or BlackwellConfig(128, 256, 3))


@dataclasses.dataclass(frozen=True, slots=True)
class _ArchDevice(jax.sharding.AbstractDevice):
    compute_capability: str = "10.0"


@contextlib.contextmanager
def lowering_arch(compute_capability: str = "10.0"):
    """Lower Mosaic GPU kernels for `compute_capability` on a machine without that GPU.

    jax 0.10.2 picks the Mosaic GPU target in `jax.experimental.mosaic.gpu.core._infer_arch`: the
    `compute_capability` of the current abstract mesh's `abstract_device`, else of the default
    device, else (no such attribute, e.g. CPU) sm_90. There is no flag; this context sets a
    one-device abstract mesh whose abstract device carries the requested capability, so
    `jax.export.export(..., platforms=("cuda",))` inside it targets e.g. sm_100a (tcgen05).
    """
    dev = _ArchDevice(device_kind="lowering-only", num_cores=None, platform="gpu",
                      compute_capability=compute_capability)
    mesh = jax.sharding.AbstractMesh((1,), ("_arch",), abstract_device=dev)
    with jax.sharding.use_abstract_mesh(mesh):
        yield
