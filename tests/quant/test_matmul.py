"""Block-scaled matmul references vs jax.lax.scaled_dot and vs each other (docs/SPEC.md §3)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from horizon.quant import formats as F
from horizon.quant import matmul as Q

DN = (((1,), (1,)), ((), ()))


def _data(M=16, N=24, K=128, seed=0):
    ka, kb = jax.random.split(jax.random.key(seed))
    return jax.random.normal(ka, (M, K)), jax.random.normal(kb, (N, K))


def test_mxfp8_matmul_matches_scaled_dot():
    a, b = _data()
    qa, qb = F.quantize_mxfp8(a), F.quantize_mxfp8(b)
    oracle = jax.lax.scaled_dot(qa.values, qb.values, lhs_scale=qa.scales, rhs_scale=qb.scales,
                                dimension_numbers=DN, preferred_element_type=jnp.float32)
    # both compute exact products of the same dequantized values; only f32 summation order
    # differs (128 terms of magnitude <= ~10): 1e-5 relative to the output scale.
    for mode in Q.MODES:
        out = Q.blockscaled_matmul_reference(qa, qb, mode=mode)
        np.testing.assert_allclose(out, oracle, atol=1e-5 * float(jnp.abs(oracle).max()))


@pytest.mark.parametrize("scaling", ["per_tensor", "per_token"])
def test_nvfp4_matmul_matches_scaled_dot(scaling):
    a, b = _data(seed=1)
    qa, qb = F.quantize_nvfp4(a, scaling=scaling), F.quantize_nvfp4(b, scaling=scaling)
    raw = jax.lax.scaled_dot(qa.values, qb.values, lhs_scale=qa.block_scales, rhs_scale=qb.block_scales,
                             dimension_numbers=DN, preferred_element_type=jnp.float32)
    ga = qa.global_scale if scaling == "per_tensor" else qa.global_scale.reshape(-1, 1)
    gb = qb.global_scale if scaling == "per_tensor" else qb.global_scale.reshape(1, -1)
    oracle = raw * ga * gb
    for mode in Q.MODES:
        out = Q.blockscaled_matmul_reference(qa, qb, mode=mode)
        np.testing.assert_allclose(out, oracle, atol=1e-5 * float(jnp.abs(oracle).max()))


def test_per_block_accumulate_equals_dequant_dot():
    a, b = _data(M=8, N=8, K=256, seed=2)
    a = a * jnp.exp2(jnp.arange(256) % 7.0)  # block scales differ along K
    qa, qb = F.quantize_mxfp8(a), F.quantize_mxfp8(b)
    x = Q.blockscaled_matmul_reference(qa, qb, mode="dequant")
    y = Q.blockscaled_matmul_reference(qa, qb, mode="per_block_accumulate")
    np.testing.assert_allclose(x, y, rtol=0, atol=2e-6 * float(jnp.abs(x).max()))  # f32 order only
    # and quantization error vs the exact product is at the MXFP8 level (~3%), not larger
    exact = a @ b.T
    assert float(jnp.linalg.norm(x - exact) / jnp.linalg.norm(exact)) < 0.08


def test_grouped_reference_matches_per_group_loop():
    T, K, N, G = 40, 64, 16, 3
    ka, kb = jax.random.split(jax.random.key(3))
    a = jax.random.normal(ka, (T, K))
    b = jax.random.normal(kb, (G, N, K))
    gs = jnp.array([10, 0, 25], jnp.int32)  # empty group + 5 trailing rows past the sum
    for quant in (lambda v: F.quantize_mxfp8(v), lambda v: F.quantize_nvfp4(v, scaling="per_token")):
        qa, qb = quant(a), quant(b)
        out = Q.grouped_blockscaled_matmul_reference(qa, qb, gs)
        starts = [0, 10, 10, 35]
        for g in range(G):
            s, e = starts[g], starts[g + 1]
            if e == s:
                continue
            sub_a = jax.tree_util.tree_map(lambda t, s=s, e=e: t[s:e], qa)
            sub_b = jax.tree_util.tree_map(lambda t, g=g: t[g] if t.ndim else t, qb)
            want = Q.blockscaled_matmul_reference(sub_a, sub_b)
            np.testing.assert_allclose(out[s:e], want, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(out[35:], 0.0)


def test_dispatcher_reference_and_errors():
    a, b = _data(M=4, N=4, K=64)
    qa, qb = F.quantize_mxfp8(a), F.quantize_mxfp8(b)
    np.testing.assert_array_equal(Q.blockscaled_matmul(qa, qb, impl="reference"),
                                  Q.blockscaled_matmul_reference(qa, qb))
    with pytest.raises(ValueError, match="impl"):
        Q.blockscaled_matmul(qa, qb, impl="cuda")
    with pytest.raises(TypeError, match="share a format"):
        Q.blockscaled_matmul_reference(qa, F.quantize_nvfp4(b))
    with pytest.raises(ValueError, match="contraction"):
        Q.blockscaled_matmul_reference(qa, F.quantize_mxfp8(b[:, :32]))
