"""Blackwell tcgen05 block-scaled kernels: scale swizzle (CPU) and sm_100a lowering (docs/SPEC.md §3).

tcgen05 has no Mosaic GPU interpreter in jax 0.10.2, so the kernels' numerics are NOT tested here
(only on a Blackwell GPU: benchmarks/kernels_gpu.py --blackwell). These tests check the scale
layout helper exactly and that the kernels lower to block-scaled tcgen05 MMAs for sm_100a.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from horizon.quant import formats as F
from pallas_kernels import blockscaled_matmul_blackwell as BW


@pytest.mark.parametrize("mn,kb", [(128, 4), (256, 8), (160, 12)])  # 160: padded to 256 rows
def test_swizzle_scales_matches_index_formula(mn, kb):
    s = np.arange(mn * kb, dtype=np.int32).reshape(mn, kb) + 1  # distinct, nonzero
    out = np.asarray(BW.swizzle_scales(jnp.asarray(s)))
    tiles = -(-mn // 128)
    assert out.shape == (tiles, kb // 4, 32, 16)
    padded = np.zeros((tiles * 128, kb), np.int32)
    padded[:mn] = s
    for i in range(tiles):
        for j in range(kb // 4):
            for r in range(32):
                for c in range(16):  # PTX 1X scale layout: c = 4 * quarter + column-in-group
                    assert out[i, j, r, c] == padded[128 * i + 32 * (c // 4) + r, 4 * j + c % 4]


def test_swizzle_scales_keeps_fp8_bytes():
    q = F.quantize_mxfp8(jax.random.normal(jax.random.key(0), (128, 256)))
    sw = BW.swizzle_scales(q.scales)
    assert sw.dtype == jnp.float8_e8m0fnu
    got = np.sort(np.asarray(jax.lax.bitcast_convert_type(sw, jnp.uint8)).ravel())
    want = np.sort(np.asarray(jax.lax.bitcast_convert_type(q.scales, jnp.uint8)).ravel())
    np.testing.assert_array_equal(got, want)  # a permutation of the same bytes


def test_swizzle_scales_bad_k():
    with pytest.raises(ValueError, match="multiple of 4"):
        BW.swizzle_scales(jnp.zeros((128, 6), jnp.float32))


def test_lowering_arch_selects_sm100():
    from jax.experimental.mosaic.gpu import core as mgpu_core

    assert mgpu_core._infer_arch() == (9, 0)  # CPU default: Mosaic falls back to sm_90
    with BW.lowering_arch("10.0"):
        assert mgpu_core._infer_arch() == (10, 0)
    assert mgpu_core._infer_arch() == (9, 0)


def _export_text(f, *args):
    with BW.lowering_arch("10.0"):
        return jax.export.export(jax.jit(f), platforms=("cuda",))(*args).mlir_module()


def test_mxfp8_lowers_to_block_scaled_tcgen05():
    m, n, k = 256, 256, 512  # 2 x 2 tiles, 4 K steps through a 3-deep ring (wraps)
    qa = F.quantize_mxfp8(jax.random.normal(jax.random.key(1), (m, k)))
    qb = F.quantize_mxfp8(jax.random.normal(jax.random.key(2), (n, k)))
    text = _export_text(lambda *x: BW.mxfp8_matmul_from_parts(*x, out_dtype=jnp.bfloat16),
                        qa.values, qa.scales, qb.values, qb.scales)
    assert "mosaic_gpu" in text
    assert "tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale" in text  # E4M3 x E8M0 scales in TMEM
    assert "tcgen05.cp" in text  # scales SMEM -> TMEM
    assert "tcgen05.ld" in text  # epilogue reads the TMEM accumulator


@pytest.mark.parametrize("scaling", ["per_token", "per_tensor"])
def test_nvfp4_lowers_to_block_scaled_tcgen05(scaling):
    m, n, k = 128, 256, 512
    qa = F.quantize_nvfp4(jax.random.normal(jax.random.key(3), (m, k)), scaling=scaling)
    qb = F.quantize_nvfp4(jax.random.normal(jax.random.key(4), (n, k)), scaling=scaling)
    text = _export_text(lambda *x: BW.nvfp4_matmul_from_parts(*x),
                        qa.values, qa.block_scales, qa.global_scale,
                        qb.values, qb.block_scales, qb.global_scale)
    kinds = set(re.findall(r"kind::[\w.:]+", text))
    assert "kind::mxf4nvf4.block_scale.scale_vec::4X" in kinds  # E2M1 x E4M3 per 16 (NVFP4)
    assert "tcgen05.cp" in text


def test_bad_shapes_and_dtypes():
    qa = F.quantize_mxfp8(jnp.ones((128, 128)))
    with pytest.raises(ValueError, match="multiple of 128"):
        BW.mxfp8_matmul_from_parts(qa.values[:64], qa.scales[:64], qa.values, qa.scales)
    with pytest.raises(ValueError, match="tile_k"):
        BW.mxfp8_matmul_from_parts(qa.values, qa.scales, qa.values, qa.scales,
                                   config=BW.BlackwellConfig(128, 64, 2))
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        BW.mxfp8_matmul_from_parts(qa.values.astype(jnp.bfloat16), qa.scales, qa.values, qa.scales)
