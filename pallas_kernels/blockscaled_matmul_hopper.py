"""Hopper (sm_90a) block-scaled matmul in Pallas / Mosaic GPU (docs/SPEC.md §3).

out[M, N] = A[M, K] @ B[N, K]^T, both operands K-major.

MXFP8 (`mxfp8_matmul`): FP8 E4M3 values with one E8M0 scale per 32 K-elements.
Hopper has no block-scaled MMA, so the scales are applied by *promotion*
(DeepGEMM's sm90 scheme, with MX's 32-wide blocks instead of DeepGEMM's 128):
for every 32-wide K block `kb` one wgmma (fp8 x fp8 -> f32, K=32 is exactly one
wgmma instruction's K) writes a fresh accumulator `partial`; after waiting on it,
    acc += sa[row, kb] * sb[col, kb] * partial
in f32 registers. The scales cannot be regrouped to 128 without changing the
numerics (they differ per 32-block), so the promotion runs every 32 K-elements:
4x DeepGEMM's promotion work, the price of exact MX semantics.

NVFP4 (`nvfp4_matmul`): FP4 E2M1 values (packed 2/byte, low nibble = even
element) with one E4M3 scale per 16 elements and an FP32 second-level decode scale
(per token = per row, or per tensor). e2m1 x e4m3 has at most 2 + 4 significant
bits, so `value * block_scale` is *exact* in BF16: the kernel dequantizes each
K-chunk to BF16 in registers, stores it to SMEM and runs a plain BF16 wgmma, with
no per-block promotion. The FP32 global scales are constant along K and are
applied once in the epilogue: out = acc * ga[row] * gb[col].
K order inside a chunk is permuted (all even elements, then all odd ones) for both
operands alike, which leaves the dot product unchanged and avoids interleaving
nibbles in registers.

Scales are passed to the kernel as f32, K-block-major ([K/blk, M]) so a block's
scales for a tile are one contiguous SMEM row (converted in the wrapper: M*K/32
elements, negligible next to the matmul).

Grid: persistent, `num_sms` CTAs (passed explicitly, never queried) loop over
output tiles; each CTA is one warpgroup; K-chunks are double-buffered with TMA.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from jaxtyping import Array, Float, UInt8

from pallas_kernels import _common as C

MX_BLOCK = 32
NV_BLOCK = 16


def _tile_loop(num_tiles: int, body) -> None:
    """Persistent loop: CTA `c` handles tiles c, c + num_ctas, ..."""
    cta = lax.axis_index("sm")
    num_ctas = lax.axis_size("sm")

    trips = (num_tiles - cta + num_ctas - 1) // num_ctas

    def loop_body(i, carry):
        body(cta + i * num_ctas)
        return carry

    lax.fori_loop(0, trips, loop_body, None)


def promoted_chunk(acc: Array, a_s: Any, b_s: Any, sa_s: Any, sb_s: Any, slot: Any, *, cfg: C.HopperConfig,
                   interpret: Any) -> Array:
    """`acc` plus the MX blocks of one loaded K chunk (SMEM `slot` of A [tm, tk], B [tn, tk] and the f32 scales
    [nsub, tm] / [nsub, tn]): per 32-wide block one fp8 wgmma into a fresh accumulator, promoted as
    `acc += sa[row] * sb[col] * partial`. With `cfg.overlap` block j+1's wgmma is in flight while block j is
    promoted (docs/KERNELS.md "Hopper MXFP8"); the sums and their order are the same. The dense and the
    grouped kernel's K loops."""
    tm, tn, nsub = cfg.tile_m, cfg.tile_n, cfg.tile_k // MX_BLOCK

    def block_mma(p_ref, j):
        sub = pl.ds(j * MX_BLOCK, MX_BLOCK)
        C.wgmma_nt(p_ref, a_s.at[slot, :, sub], b_s.at[slot, :, sub], interpret)

    def promote(out, partial, j):
        sa = C.load_with_layout(sa_s, (slot, j, slice(None)), plgpu.Layout.WGMMA.reduce(1), interpret)
        sb = C.load_with_layout(sb_s, (slot, j, slice(None)), plgpu.Layout.WGMMA.reduce(0), interpret)
        return out + partial * (lax.broadcast_in_dim(sa, (tm, tn), (0,)) * lax.broadcast_in_dim(sb, (tm, tn), (1,)))

    if cfg.overlap:
        # Block j was issued into p_cur: issue block j+1 into a fresh accumulator, wait until only it is in
        # flight, promote block j meanwhile. Each scope nests the next (p_cur is dead after its load).
        def blocks_from(j, p_cur, out):
            if j + 1 == nsub:
                return promote(out, C.accumulator_load(p_cur, 0, interpret), j)

            def nxt(p_next):
                block_mma(p_next, j + 1)
                return blocks_from(j + 1, p_next, promote(out, C.accumulator_load(p_cur, 1, interpret), j))

            return pl.run_scoped(nxt, plgpu.ACC((tm, tn), jnp.float32))

        def first(p0):
            block_mma(p0, 0)
            return blocks_from(0, p0, acc)

        return pl.run_scoped(first, plgpu.ACC((tm, tn), jnp.float32))
    for j in range(nsub):

        def mma(p_ref):
            block_mma(p_ref, j)  # noqa: B023 - run_scoped traces it now
            plgpu.wgmma_wait(0)
            return p_ref[...]

        acc = promote(acc, pl.run_scoped(mma, plgpu.ACC((tm, tn), jnp.float32)), j)
    return acc


def _mxfp8_kernel(a_g, b_g, sa_g, sb_g, o_g, *, cfg: C.HopperConfig, m_tiles: int, n_tiles: int,
                  k_chunks: int, interpret: Any):
    tm, tn, tk = cfg.tile_m, cfg.tile_n, cfg.tile_k
    nsub = tk // MX_BLOCK
    in_tr = C.smem_transforms(MX_BLOCK, jnp.float8_e4m3fn)
    out_tr = C.smem_transforms(tn, o_g.dtype)

    def scoped(a_s, b_s, sa_s, sb_s, o_s, bars):
        def issue(mi, ni, kc, slot):
            ks = pl.ds(kc * tk, tk)
            kbs = pl.ds(kc * nsub, nsub)
            plgpu.copy_gmem_to_smem(a_g.at[pl.ds(mi * tm, tm), ks], a_s.at[slot], bars.at[4 * slot + 0])
            plgpu.copy_gmem_to_smem(b_g.at[pl.ds(ni * tn, tn), ks], b_s.at[slot], bars.at[4 * slot + 1])
            plgpu.copy_gmem_to_smem(sa_g.at[kbs, pl.ds(mi * tm, tm)], sa_s.at[slot], bars.at[4 * slot + 2])
            plgpu.copy_gmem_to_smem(sb_g.at[kbs, pl.ds(ni * tn, tn)], sb_s.at[slot], bars.at[4 * slot + 3])

        def wait(slot):
            for i in range(4):
                plgpu.barrier_wait(bars.at[4 * slot + i])

        def tile(t):
            mi = t // n_tiles
            ni = t % n_tiles
            issue(mi, ni, 0, 0)

            def k_body(kc, acc):
                slot = kc % 2

                @pl.when(kc + 1 < k_chunks)
                def _prefetch():
                    issue(mi, ni, kc + 1, 1 - slot)

                wait(slot)
                return promoted_chunk(acc, a_s, b_s, sa_s, sb_s, slot, cfg=cfg, interpret=interpret)

            acc0 = C.with_layout(jnp.zeros((tm, tn), jnp.float32), plgpu.Layout.WGMMA, interpret)
            acc = lax.fori_loop(0, k_chunks, k_body, acc0)
            plgpu.wait_smem_to_gmem(0)
            o_s[...] = acc.astype(o_s.dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o_s, o_g.at[pl.ds(mi * tm, tm), pl.ds(ni * tn, tn)])

        _tile_loop(m_tiles * n_tiles, tile)
        plgpu.wait_smem_to_gmem(0)

    pl.run_scoped(
        scoped,
        plgpu.SMEM((2, tm, tk), jnp.float8_e4m3fn, transforms=in_tr),
        plgpu.SMEM((2, tn, tk), jnp.float8_e4m3fn, transforms=in_tr),
        plgpu.SMEM((2, nsub, tm), jnp.float32),
        plgpu.SMEM((2, nsub, tn), jnp.float32),
        plgpu.SMEM((tm, tn), o_g.dtype, transforms=out_tr),
        plgpu.Barrier(num_barriers=8),
    )


def auto_config(m: int, n: int, k: int) -> C.HopperConfig:
    """Largest default tiles that divide the problem (tile_m 64; tile_n <= 128; tile_k <= 128)."""
    tn = next((t for t in (128, 64, 32, 16, 8) if n % t == 0), None)
    tk = next((t for t in (128, 64, 32) if k % t == 0), None)
    if m % 64 or tn is None or tk is None:
        raise ValueError(f"shape M={m}, N={n}, K={k} needs M % 64 == 0, N % 8 == 0, K % 32 == 0")
    return C.HopperConfig(64, tn, tk)


def mxfp8_matmul_from_parts(
    a_values: Float[Array, "m k"],
    a_scales: Array,
    b_values: Float[Array, "n k"],
    b_scales: Array,
    *,
    out_dtype: Any = jnp.float32,
    config: C.HopperConfig | None = None,
    num_sms: int = C.H100_SMS,
    interpret: Any = None,
) -> Float[Array, "m n"]:
    """MXFP8 x MXFP8 -> out_dtype on Hopper (docs/SPEC.md §3). Values e4m3 [M,K]/[N,K]; scales e8m0 [.., K/32]."""
    m, k = a_values.shape
    n, k2 = b_values.shape
    if k != k2:
        raise ValueError(f"K mismatch: A {a_values.shape} vs B {b_values.shape}")
    cfg = config or auto_config(m, n, k)
    cfg.check()
    if a_values.dtype != jnp.float8_e4m3fn or b_values.dtype != jnp.float8_e4m3fn:
        raise ValueError(f"MXFP8 values must be float8_e4m3fn, got {a_values.dtype}, {b_values.dtype}")
    if a_scales.shape != (m, k // MX_BLOCK) or b_scales.shape != (n, k // MX_BLOCK):
        raise ValueError(f"scale shapes {a_scales.shape}, {b_scales.shape} do not match K/32={k // MX_BLOCK}")
    if cfg.tile_k % MX_BLOCK:
        raise ValueError(f"tile_k={cfg.tile_k} must be a multiple of {MX_BLOCK}")
    C.check_divisible("M", m, cfg.tile_m)
    C.check_divisible("N", n, cfg.tile_n)
    C.check_divisible("K", k, cfg.tile_k)
    sa = C.e8m0_to_f32(a_scales).T  # [K/32, M]
    sb = C.e8m0_to_f32(b_scales).T  # [K/32, N]
    m_tiles, n_tiles, k_chunks = m // cfg.tile_m, n // cfg.tile_n, k // cfg.tile_k
    grid = min(num_sms, m_tiles * n_tiles)
    kern = functools.partial(_mxfp8_kernel, cfg=cfg, m_tiles=m_tiles, n_tiles=n_tiles, k_chunks=k_chunks,
                             interpret=interpret)
    f = plgpu.kernel(
        kern,
        out_type=jax.ShapeDtypeStruct((m, n), out_dtype),
        grid=(grid,),
        grid_names=("sm",),
        interpret=interpret,
    )
    return f(a_values, b_values, sa, sb)


def _decode_fp4_times_scale(codes_u8: Array, scale: Array) -> Array:
    """E2M1 code (low 4 bits of an int32) times an f32 block scale -> f32 (exact)."""
    mag = codes_u8 & 7
    e = mag >> 1
    m = (mag & 1).astype(jnp.float32)
    pow2 = jnp.where(e == 1, 1.0, jnp.where(e == 2, 2.0, 4.0))
    mag_f = jnp.where(e == 0, 0.5 * m, pow2 * (1.0 + 0.5 * m))
    val = jnp.where((codes_u8 & 8) != 0, -mag_f, mag_f)
    return val * scale


def _nvfp4_kernel(a_g, b_g, sa_g, sb_g, ga_g, gb_g, o_g, *, cfg: C.HopperConfig, m_tiles: int,
                  n_tiles: int, k_chunks: int, interpret: Any):
    tm, tn, tk = cfg.tile_m, cfg.tile_n, cfg.tile_k
    tb = tk // 2  # packed bytes per row per chunk
    bf_tr = C.smem_transforms(tb, jnp.bfloat16)
    out_tr = C.smem_transforms(tn, o_g.dtype)

    def scoped(ap_s, bp_s, as_s, bs_s, abf_s, bbf_s, ga_s, gb_s, o_s, bars):
        # abf_s / bbf_s: [2, rows, tb] bf16 -- [0] even K elements (low nibbles), [1] odd ones.
        def tile(t):
            mi = t // n_tiles
            ni = t % n_tiles
            rows_a, rows_b = pl.ds(mi * tm, tm), pl.ds(ni * tn, tn)

            def k_body(kc, acc):
                ks = pl.ds(kc * tb, tb)
                plgpu.copy_gmem_to_smem(a_g.at[rows_a, ks], ap_s, bars.at[0])
                plgpu.copy_gmem_to_smem(b_g.at[rows_b, ks], bp_s, bars.at[1])
                plgpu.copy_gmem_to_smem(sa_g.at[rows_a, ks], as_s, bars.at[2])
                plgpu.copy_gmem_to_smem(sb_g.at[rows_b, ks], bs_s, bars.at[3])
                for i in range(4):
                    plgpu.barrier_wait(bars.at[i])
                # Dequantize to BF16 (exact), K permuted as [even elements | odd elements].
                for src, scl, dst in ((ap_s, as_s, abf_s), (bp_s, bs_s, bbf_s)):
                    # Explicit WGMMA register layout: a swizzled SMEM store needs a tiled layout
                    # (the default strided one has no lowering; docs/KERNELS.md).
                    full = (slice(None), slice(None))
                    p = C.load_with_layout(src, full, plgpu.Layout.WGMMA, interpret, optimized=False).astype(jnp.int32)
                    s = C.load_with_layout(scl, full, plgpu.Layout.WGMMA, interpret,
                                           optimized=False).astype(jnp.float32)
                    dst[0] = _decode_fp4_times_scale(p & 15, s).astype(jnp.bfloat16)
                    dst[1] = _decode_fp4_times_scale(p >> 4, s).astype(jnp.bfloat16)
                plgpu.commit_smem()

                def mma(p_ref):
                    C.wgmma_nt(p_ref, abf_s.at[0], bbf_s.at[0], interpret)
                    C.wgmma_nt(p_ref, abf_s.at[1], bbf_s.at[1], interpret)
                    plgpu.wgmma_wait(0)
                    return p_ref[...]

                return acc + pl.run_scoped(mma, plgpu.ACC((tm, tn), jnp.float32))

            acc0 = C.with_layout(jnp.zeros((tm, tn), jnp.float32), plgpu.Layout.WGMMA, interpret)
            acc = lax.fori_loop(0, k_chunks, k_body, acc0)
            plgpu.copy_gmem_to_smem(ga_g.at[rows_a], ga_s, bars.at[4])
            plgpu.copy_gmem_to_smem(gb_g.at[rows_b], gb_s, bars.at[5])
            plgpu.barrier_wait(bars.at[4])
            plgpu.barrier_wait(bars.at[5])
            ga = C.load_with_layout(ga_s, (slice(None),), plgpu.Layout.WGMMA.reduce(1), interpret)
            gb = C.load_with_layout(gb_s, (slice(None),), plgpu.Layout.WGMMA.reduce(0), interpret)
            acc = acc * (lax.broadcast_in_dim(ga, (tm, tn), (0,)) * lax.broadcast_in_dim(gb, (tm, tn), (1,)))
            plgpu.wait_smem_to_gmem(0)
            o_s[...] = acc.astype(o_s.dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o_s, o_g.at[rows_a, rows_b])

        _tile_loop(m_tiles * n_tiles, tile)
        plgpu.wait_smem_to_gmem(0)

    pl.run_scoped(
        scoped,
        plgpu.SMEM((tm, tb), jnp.uint8),
        plgpu.SMEM((tn, tb), jnp.uint8),
        plgpu.SMEM((tm, tb), jnp.float8_e4m3fn),
        plgpu.SMEM((tn, tb), jnp.float8_e4m3fn),
        plgpu.SMEM((2, tm, tb), jnp.bfloat16, transforms=bf_tr),
        plgpu.SMEM((2, tn, tb), jnp.bfloat16, transforms=bf_tr),
        plgpu.SMEM((tm,), jnp.float32),
        plgpu.SMEM((tn,), jnp.float32),
        plgpu.SMEM((tm, tn), o_g.dtype, transforms=out_tr),
        plgpu.Barrier(num_barriers=6),
    )


def nvfp4_matmul_from_parts(
    a_packed: UInt8[Array, "m k2"],
    a_block_scales: Array,
    a_global: Array,
    b_packed: UInt8[Array, "n k2"],
    b_block_scales: Array,
    b_global: Array,
    *,
    out_dtype: Any = jnp.float32,
    config: C.HopperConfig | None = None,
    num_sms: int = C.H100_SMS,
    interpret: Any = None,
) -> Float[Array, "m n"]:
    """NVFP4 x NVFP4 on Hopper (docs/SPEC.md §3): packed E2M1 [.., K/2], E4M3 scales [.., K/16], f32 global
    decode scale per row ([.., 1]) or per tensor ([])."""
    m, kb = a_packed.shape
    n, kb2 = b_packed.shape
    k = 2 * kb
    if kb != kb2:
        raise ValueError(f"K mismatch: A {a_packed.shape} vs B {b_packed.shape}")
    if a_block_scales.shape != (m, k // NV_BLOCK) or b_block_scales.shape != (n, k // NV_BLOCK):
        raise ValueError("block scale shapes do not match K/16")
    cfg = config or auto_config(m, n, k)
    cfg = C.HopperConfig(cfg.tile_m, cfg.tile_n, cfg.tile_k)  # chunk tk -> two bf16 halves of tk/2
    cfg.check()
    C.check_divisible("M", m, cfg.tile_m)
    C.check_divisible("N", n, cfg.tile_n)
    C.check_divisible("K", k, cfg.tile_k)
    # Scale byte per packed byte (8 packed bytes = one 16-element block).
    sa = jnp.repeat(a_block_scales, NV_BLOCK // 2, axis=-1)
    sb = jnp.repeat(b_block_scales, NV_BLOCK // 2, axis=-1)
    ga = jnp.broadcast_to(jnp.asarray(a_global, jnp.float32).reshape(-1), (m,))
    gb = jnp.broadcast_to(jnp.asarray(b_global, jnp.float32).reshape(-1), (n,))
    m_tiles, n_tiles, k_chunks = m // cfg.tile_m, n // cfg.tile_n, k // cfg.tile_k
    kern = functools.partial(_nvfp4_kernel, cfg=cfg, m_tiles=m_tiles, n_tiles=n_tiles, k_chunks=k_chunks,
                             interpret=interpret)
    f = plgpu.kernel(kern, out_type=jax.ShapeDtypeStruct((m, n), out_dtype),
                     grid=(min(num_sms, m_tiles * n_tiles),), grid_names=("sm",), interpret=interpret)
    return f(a_packed, b_packed, sa, sb, ga, gb)
