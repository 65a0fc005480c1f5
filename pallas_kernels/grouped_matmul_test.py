"""Grouped (MoE) MXFP8 Hopper kernel: GPU-interpret correctness vs horizon.quant, schedule, lowering
(docs/SPEC.md §3)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from horizon.quant import formats as F
from horizon.quant.matmul import grouped_blockscaled_matmul_reference
from pallas_kernels import _common as C
from pallas_kernels import grouped_matmul as GM
from pallas_kernels.dispatch import grouped_blockscaled_matmul_pallas


def _operands(key, t, g, n, k):
    ka, kb = jax.random.split(key)
    # Per-32 magnitudes differ block to block so the promotion's scales matter.
    a = jax.random.normal(ka, (t, k)) * jnp.exp2(jnp.arange(k) // 32 % 5 - 2.0)
    b = jax.random.normal(kb, (g, n, k)) * jnp.exp2(-(jnp.arange(g)[:, None, None] % 3) + 1.0)
    return F.quantize_mxfp8(a), F.quantize_mxfp8(b)


def _bound(qa, qb, group_sizes, k):
    # Each e4m3 x e4m3 product and power-of-two scale product is exact in f32; only the summation
    # order differs (per-32 partials, then promotion): <= K f32 ulps of sum |a||b| per output.
    da, db = jnp.abs(F.dequantize_mxfp8(qa)), jnp.abs(F.dequantize_mxfp8(qb))
    mag = jax.lax.ragged_dot(da, db.transpose(0, 2, 1), group_sizes, precision="highest")
    return k * 2.0**-23 * np.asarray(mag)


@pytest.mark.parametrize("t,sizes,n,k,tiles", [
    # ragged: group 0 spans 2 tiles, an empty group, boundaries mid-tile, T not a tile multiple,
    # rows past the sum (must come out 0); 2 K chunks (double buffer wraps)
    (150, (70, 0, 40, 30), 64, 128, (64, 64, 64)),
    # empty first and last groups, 2 K chunks (double buffer wraps), 2 N tiles, sum == T
    pytest.param(128, (0, 64, 37, 27, 0), 128, 128, (64, 64, 64), marks=pytest.mark.slow),
])
def test_grouped_interpret_matches_reference(t, sizes, n, k, tiles):
    gs = jnp.array(sizes, jnp.int32)
    qa, qb = _operands(jax.random.key(t + n), t, len(sizes), n, k)
    out = GM.grouped_mxfp8_matmul_from_parts(qa.values, qa.scales, qb.values, qb.scales, gs,
                                             config=C.HopperConfig(*tiles), num_sms=2,
                                             interpret=C.interpret_params())
    ref = np.asarray(grouped_blockscaled_matmul_reference(qa, qb, gs))
    assert out.shape == (t, n) and out.dtype == jnp.float32
    assert np.all(np.abs(np.asarray(out) - ref) <= _bound(qa, qb, gs, k) + 1e-30)
    tail = int(np.sum(sizes))
    assert np.all(np.asarray(out)[tail:] == 0.0)  # rows past sum(group_sizes) are exactly 0
    assert np.all(np.abs(np.asarray(out)[:tail]).max(axis=1) > 0)  # every routed row was written


def test_grouped_overlapped_promotion_is_bitwise_the_waited_for_kernel():
    """HopperConfig.overlap through the grouped kernel's K loop (the dense kernel's `promoted_chunk`): ragged
    groups, an empty one, 2 K chunks of 2 blocks."""
    gs = jnp.array((70, 0, 40, 30), jnp.int32)
    qa, qb = _operands(jax.random.key(5), 150, 4, 64, 128)
    outs = [np.asarray(GM.grouped_mxfp8_matmul_from_parts(qa.values, qa.scales, qb.values, qb.scales, gs,
                                                          config=C.HopperConfig(64, 64, 64, overlap=ov), num_sms=2,
                                                          interpret=C.interpret_params())) for ov in (False, True)]
    np.testing.assert_array_equal(outs[1], outs[0])


def test_grouped_all_empty_groups_give_zeros_bf16_via_dispatch():
    gs = jnp.zeros((3,), jnp.int32)
    qa, qb = _operands(jax.random.key(5), 64, 3, 64, 64)
    out = grouped_blockscaled_matmul_pallas(qa, qb, gs, out_dtype=jnp.bfloat16, num_sms=1,
                                            interpret=C.interpret_params())
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.zeros((64, 64), np.float32))


def test_tile_schedule_covers_each_row_once():
    sizes = jnp.array([0, 5, 64, 0, 1, 100, 0], jnp.int32)
    rows, tm = 200, 64  # 170 routed rows + 30 past the sum (zero group)
    s = np.asarray(GM.tile_schedule(sizes, rows, tm))
    assert s.shape == (4, -(-rows // tm) + len(sizes))
    owner = np.full(rows, -1)
    for grp, row0, start, size in s.T:
        assert 0 <= start and start + size <= tm and row0 % tm == 0
        r = np.arange(row0 + start, row0 + start + size)
        assert np.all(owner[r] == -1)  # no row stored twice
        owner[r] = grp
    ends = np.cumsum(np.asarray(sizes))
    expected = np.searchsorted(ends, np.arange(rows), side="right")  # 7 = zero group
    np.testing.assert_array_equal(owner, expected)


def test_grouped_bad_shapes():
    qa, qb = _operands(jax.random.key(1), 64, 2, 64, 64)
    gs = jnp.array([32, 32], jnp.int32)
    with pytest.raises(ValueError, match="G, N, K"):
        GM.grouped_mxfp8_matmul_from_parts(qa.values, qa.scales, qb.values[0], qb.scales[0], gs)
    with pytest.raises(ValueError, match="group_sizes"):
        GM.grouped_mxfp8_matmul_from_parts(qa.values, qa.scales, qb.values, qb.scales, gs[:1])
    with pytest.raises(ValueError, match="K mismatch"):
        GM.grouped_mxfp8_matmul_from_parts(qa.values, qa.scales, qb.values[..., :32], qb.scales[..., :1], gs)


def test_grouped_lowers_to_wgmma_for_cuda():
    qa, qb = _operands(jax.random.key(2), 256, 4, 256, 256)
    gs = jnp.array([100, 0, 120, 36], jnp.int32)

    def f(av, asc, bv, bsc, g):
        return GM.grouped_mxfp8_matmul_from_parts(av, asc, bv, bsc, g, out_dtype=jnp.bfloat16,
                                                  config=C.HopperConfig(64, 128, 128), num_sms=C.H100_SMS)

    text = jax.export.export(jax.jit(f), platforms=("cuda",))(
        qa.values, qa.scales, qb.values, qb.scales, gs).mlir_module()
    assert "mosaic_gpu" in text
    assert "wgmma" in text
    assert "f8E4M3FN" in text


def test_grouped_dispatch_on_cpu_falls_back():
    import pallas_kernels as pk
    from horizon.quant import matmul as M

    qa, qb = _operands(jax.random.key(3), 64, 2, 64, 64)
    gs = jnp.array([40, 24], jnp.int32)
    assert not pk.is_supported(qa, qb)  # CPU: no kernel route
    out = M.grouped_blockscaled_matmul(qa, qb, gs, impl="auto")
    np.testing.assert_array_equal(np.asarray(out), np.asarray(grouped_blockscaled_matmul_reference(qa, qb, gs)))


@pytest.mark.gpu
@pytest.mark.parametrize("t,sizes,n,k", [(1000, (300, 0, 129, 1, 400, 100), 256, 512), (64, (0, 0, 64), 128, 128)])
def test_grouped_on_gpu_matches_reference(t, sizes, n, k):
    """Compiled by Mosaic GPU on a Hopper device (marked gpu; benchmarks/gpu_check.py): ragged groups,
    empty groups, T not a tile multiple, rows past the sum. Bound: the FP8 wgmma's ~14-bit in-instruction
    accumulation, 2^-9 of sum |a||b| (blockscaled_matmul_hopper_test.FP8_WGMMA_REL explains it)."""
    import pallas_kernels as pk
    if pk.supported_backend() != "hopper":
        pytest.skip("needs a Hopper GPU (sm_90)")
    gs = jnp.array(sizes, jnp.int32)
    qa, qb = _operands(jax.random.key(t + n + k), t, len(sizes), n, k)
    out = GM.grouped_mxfp8_matmul_from_parts(qa.values, qa.scales, qb.values, qb.scales, gs, num_sms=8)
    ref = np.asarray(grouped_blockscaled_matmul_reference(qa, qb, gs))
    hw = _bound(qa, qb, gs, k) / (k * 2.0**-23) * 2.0**-9  # 2^-9 * sum |a||b|
    assert np.all(np.abs(np.asarray(out) - ref) <= _bound(qa, qb, gs, k) + hw + 1e-30)
    tail = int(np.sum(sizes))
    assert np.all(np.asarray(out)[tail:] == 0.0)
    assert np.all(np.abs(np.asarray(out)[:tail]).max(axis=1) > 0)
