"""MXFP8 / NVFP4 quantizers vs independent oracles, special values, packing (docs/SPEC.md §3)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from horizon.quant import formats as F
from tests.quant import oracle


def _u8(a):
    return np.asarray(jax.lax.bitcast_convert_type(a, jnp.uint8))


def _wide_range(seed, shape):
    """Gaussian signs x log-uniform magnitudes over 2^-40..2^40 per block: exercises E4M3/E2M1
    subnormals, saturation and far-apart block scales."""
    r = np.random.default_rng(seed)
    mag = 2.0 ** r.uniform(-40, 40, size=shape[:-1] + (1,)) * np.abs(r.standard_normal(shape))
    mag *= 2.0 ** r.uniform(-12, 0, size=shape)  # small elements inside a block
    return (np.sign(r.standard_normal(shape)) * mag).astype(np.float32)


@pytest.mark.parametrize("rule", ["rceil", "floor"])
@pytest.mark.parametrize("gen", ["gauss", "wide"])
def test_mxfp8_bit_exact_vs_oracle(rule, gen):
    shape = (16, 128)
    x = (np.random.default_rng(0).standard_normal(shape).astype(np.float32) if gen == "gauss"
         else _wide_range(1, shape))
    # exact boundary cases in the first row: amax = 448 * 2^k exactly, and one ulp above
    x[0, :32] = 0.1
    x[0, 0] = 448.0 * 2.0 ** -3
    x[0, 32:64] = 0.1
    x[0, 32] = np.nextafter(np.float32(448.0), np.float32(1e9))
    q = F.quantize_mxfp8(jnp.asarray(x), scale_rule=rule)
    assert q.values.dtype == jnp.float8_e4m3fn and q.scales.dtype == jnp.float8_e8m0fnu
    ov, os_ = oracle.quantize_mx(x, rule)
    np.testing.assert_array_equal(_u8(q.scales), os_)
    np.testing.assert_array_equal(_u8(q.values), ov)


def test_mx_rules_on_boundaries():
    # amax = 448 -> rceil e = 0 (448 fits), floor e = floor(log2 448) - 8 = 0; amax = 500:
    # rceil e = 1 (250 -> 256 in E4M3), floor e = 0 and 500 saturates to 448 (never NaN).
    x = np.zeros((2, 32), np.float32)
    x[0, 0], x[1, 0] = 448.0, 500.0
    for rule, want_e, want_v in [("rceil", [0, 1], [448.0, 256.0]), ("floor", [0, 0], [448.0, 448.0])]:
        q = F.quantize_mxfp8(jnp.asarray(x), scale_rule=rule)
        np.testing.assert_array_equal(_u8(q.scales)[:, 0].astype(int) - 127, want_e)
        np.testing.assert_array_equal(np.asarray(q.values.astype(jnp.float32))[:, 0], want_v)


def test_mx_special_values():
    x = np.ones((5, 32), np.float32)
    x[0] = 0.0  # zero block
    x[1, 5] = np.nan
    x[2, 7] = np.inf
    x[3, 0] = 1e30  # large but finite: scale 2^(99-8+1)
    x[4] = 2.0 ** -130  # f32-subnormal block: exponent clamps to -127
    q = F.quantize_mxfp8(jnp.asarray(x))
    s = _u8(q.scales)[:, 0]
    assert s[0] == 0 and s[1] == 255 and s[2] == 255 and s[4] == 0
    assert not np.isnan(np.asarray(q.values.astype(jnp.float32))[[0, 3, 4]]).any()
    d = np.asarray(F.dequantize_mxfp8(q))
    np.testing.assert_array_equal(d[0], 0.0)
    assert np.isnan(d[1]).all() and np.isnan(d[2]).all()
    assert np.isfinite(d[3]).all() and d[3, 0] == pytest.approx(1e30, rel=2 ** -4)
    ov, os_ = oracle.quantize_mx(x, "rceil")
    np.testing.assert_array_equal(s, os_[:, 0])


def test_block_size_errors():
    with pytest.raises(ValueError, match="multiple of the block size"):
        F.quantize_mxfp8(jnp.ones((2, 48)))
    with pytest.raises(ValueError, match="multiple of the block size"):
        F.quantize_nvfp4(jnp.ones((2, 24)))
    with pytest.raises(ValueError, match="scale_rule"):
        F.quantize_mxfp8(jnp.ones((2, 32)), scale_rule="round")
    with pytest.raises(ValueError, match="key"):
        F.quantize_nvfp4(jnp.ones((2, 32)), rounding="stochastic")


@pytest.mark.parametrize("gen", ["gauss", "wide"])
def test_nvfp4_per_tensor_bit_exact_vs_oracle(gen):
    shape = (8, 64)
    x = (np.random.default_rng(2).standard_normal(shape).astype(np.float32) if gen == "gauss"
         else _wide_range(3, shape) * 2.0 ** -20)  # wide: many blocks underflow the e4m3 scale
    q = F.quantize_nvfp4(jnp.asarray(x), scaling="per_tensor")
    assert q.values.dtype == jnp.float4_e2m1fn and q.block_scales.dtype == jnp.float8_e4m3fn
    assert q.global_scale.shape == () and q.global_scale.dtype == jnp.float32
    ov, os_, og = oracle.quantize_nvfp4_per_tensor(x)
    np.testing.assert_array_equal(_u8(q.block_scales), os_)
    np.testing.assert_array_equal(np.asarray(q.values.astype(jnp.float32)), ov)
    assert np.float32(q.global_scale) == og


def test_nvfp4_per_token_is_per_tensor_of_each_row():
    x = np.random.default_rng(4).standard_normal((6, 32)).astype(np.float32) * np.arange(1, 7)[:, None]
    q = F.quantize_nvfp4(jnp.asarray(x), scaling="per_token")
    assert q.global_scale.shape == (6, 1)
    for i in range(6):
        ov, os_, og = oracle.quantize_nvfp4_per_tensor(x[i : i + 1])
        np.testing.assert_array_equal(_u8(q.block_scales[i : i + 1]), os_)
        np.testing.assert_array_equal(np.asarray(q.values[i : i + 1].astype(jnp.float32)), ov)
        assert np.float32(q.global_scale[i, 0]) == og


def test_nvfp4_special_values():
    x = np.random.default_rng(5).standard_normal((3, 32)).astype(np.float32)
    x[1] = 0.0
    x[2, 3] = np.inf
    q = F.quantize_nvfp4(jnp.asarray(x), scaling="per_token")
    d = np.asarray(F.dequantize_nvfp4(q))
    assert np.isfinite(d[0]).all()
    np.testing.assert_array_equal(d[1], 0.0)
    assert float(q.global_scale[1, 0]) == 1.0  # amax 0 -> S_enc = 1
    assert np.isnan(d[2, :16]).all() and np.isfinite(d[2, 16:]).all()  # only the Inf's block is NaN
    # the Inf did not enter the row amax: the finite half is quantized as if it were alone
    alone = F.quantize_nvfp4(jnp.asarray(x[2:, 16:]), scaling="per_token")
    np.testing.assert_allclose(d[2, 16:], np.asarray(F.dequantize_nvfp4(alone))[0], rtol=0)
    # saturation: the block max maps to 6 * e4m3 scale; nothing becomes NaN with huge inputs
    big = F.quantize_nvfp4(jnp.full((1, 16), 3e38), scaling="per_tensor")
    assert np.isfinite(np.asarray(F.dequantize_nvfp4(big))).all()


def test_nvfp4_stochastic_rounding_unbiased():
    # 0.3 * (6 / max) lands between E2M1 points; the mean of many SR draws approaches the input
    # (std of one draw <= 0.25 of the step; 4096 draws -> std of the mean < 0.5%, tolerance 2%).
    x = jnp.tile(jnp.array([[6.0] + [1.3] * 15]), (4096, 1))
    q = F.quantize_nvfp4(x, scaling="per_token", rounding="stochastic", key=jax.random.key(0))
    d = np.asarray(F.dequantize_nvfp4(q))
    # (dequantized values carry the f32 global decode scale 1/448: 1 ulp off the grid point)
    np.testing.assert_allclose(np.unique(d[:, 1]), [1.0, 1.5], rtol=1e-6)
    assert abs(d[:, 1].mean() - 1.3) < 0.02 * 1.3
    rne = np.asarray(F.dequantize_nvfp4(F.quantize_nvfp4(x[:1], scaling="per_token")))
    assert rne[0, 1] == pytest.approx(1.5, rel=1e-6)  # RNE is deterministic and biased here


def test_approx_division_differs_from_ieee():
    # bf16-valued inputs create exact E2M1 ties under the IEEE path; the low-biased fast
    # reciprocal tips some of them the other way.
    x = jax.random.normal(jax.random.key(0), (64, 256)).astype(jnp.bfloat16).astype(jnp.float32)
    ie = F.quantize_nvfp4(x, division="ieee")
    ap = F.quantize_nvfp4(x, division="approx")
    diff = np.asarray(ie.values.astype(jnp.float32) != ap.values.astype(jnp.float32)).mean()
    assert diff > 0, "approx division should change some elements"
    assert diff < 0.05  # ...but only a few: the model is a 22-bit reciprocal
    coarse = F.quantize_nvfp4(x, division="approx", approx_bits=8)
    diff8 = np.asarray(ie.values.astype(jnp.float32) != coarse.values.astype(jnp.float32)).mean()
    assert diff8 > diff
    # MXFP8 scales are powers of two: nothing to approximate (documented; no division argument)
    assert F.approx_reciprocal(jnp.float32(3.0)) < jnp.float32(1 / 3)


def test_pack_unpack_roundtrip_and_nibble_order():
    vals = jnp.array([[0.5, 1.0, -6.0, 0.0, 3.0, -0.5]], jnp.float32).astype(jnp.float4_e2m1fn)
    p = F.pack_fp4(vals)
    assert p.dtype == jnp.uint8 and p.shape == (1, 3)
    # E2M1 codes: 0.5 = 0b0001, 1.0 = 0b0010, -6 = 0b1111, 0 = 0, 3 = 0b0101, -0.5 = 0b1001
    np.testing.assert_array_equal(np.asarray(p), [[0x21, 0x0F, 0x95]])
    ml = np.array([0.5, 1.0, -6.0, 0.0, 3.0, -0.5], ml_dtypes.float4_e2m1fn)
    np.testing.assert_array_equal(np.asarray(p)[0], np.asarray(jax.lax.bitcast_convert_type(
        jnp.asarray(ml).reshape(3, 2), jnp.uint8)))
    x = F.quantize_nvfp4(jax.random.normal(jax.random.key(1), (4, 64))).values
    back = F.unpack_fp4(F.pack_fp4(x))
    assert back.dtype == jnp.float4_e2m1fn
    np.testing.assert_array_equal(_u8_4(back), _u8_4(x))


def _u8_4(a):
    return np.asarray(jax.lax.bitcast_convert_type(a, jnp.uint4).astype(jnp.uint8))
