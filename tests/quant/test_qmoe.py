"""Quantized MoE grouped GEMM: MXFP8 backward, causality, batch sensitivity, gradients (docs/SPEC.md §3)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from horizon.quant import qmoe
from tests.quant import oracle

T, K, N, G = 64, 64, 32, 2
GS = jnp.array([40, 24], jnp.int32)


def _inputs(seed=0):
    k = jax.random.split(jax.random.key(seed), 4)
    x = jax.random.normal(k[0], (T, K))
    wg = jax.random.normal(k[1], (G, K, N)) / 8
    wu = jax.random.normal(k[2], (G, K, N)) / 8
    wd = jax.random.normal(k[3], (G, N, K)) / 8
    return x, (wg, wu, wd)


def _expert(x, ws, gs, precision):
    """SwiGLU expert chain, as in horizon.model.moe (the forward quantization reaches the
    gradients through silu and the product)."""
    f = functools.partial(qmoe.quantized_ragged_dot, group_sizes=gs, precision=precision)
    wg, wu, wd = ws
    return f(jax.nn.silu(f(x, wg)) * f(x, wu), wd)


@functools.partial(jax.jit, static_argnames=("precision",))
def _out_and_grads(x, ws, gs, ct, precision):
    y, vjp = jax.vjp(lambda x, ws: _expert(x, ws, gs, precision), x, ws)
    dx, dws = vjp(ct)
    return y, dx, dws


def _rel(a, b):
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


@pytest.fixture(scope="module")
def base():
    x, ws = _inputs()
    ct = jax.random.normal(jax.random.key(9), (T, K))
    return x, ws, ct


def test_backward_sees_mxfp8_operands():
    x, ws = _inputs(1)
    w = ws[0]
    gs = jnp.array([37, 0, 20], jnp.int32)  # ragged, an empty group, 7 rows past the sum
    w3 = jnp.concatenate([w, w[:1] * 0.5])
    dy = jax.random.normal(jax.random.key(2), (T, N))
    rec = {}
    qmoe.set_debug_hook(lambda name, q: rec.__setitem__(name, jax.device_get(q)))
    try:
        _, vjp = jax.vjp(lambda x, w: qmoe.quantized_ragged_dot(
            x, w, gs, precision="nvfp4_per_token_fwd_mxfp8_bwd"), x, w3)
        dx, dw = vjp(dy)
        jax.effects_barrier()
    finally:
        qmoe.set_debug_hook(None)
    assert set(rec) == {"dgrad_dy", "dgrad_w", "wgrad_x", "wgrad_dy"}
    for q in rec.values():
        assert q.values.dtype == jnp.float8_e4m3fn and q.scales.dtype == jnp.float8_e8m0fnu
        assert q.values.shape[-1] == 32 * q.scales.shape[-1]
    def u8(a):
        return np.asarray(a).view(np.uint8)

    # each operand is exactly the independent MXFP8 quantization along that GEMM's contraction axis
    for name, src in [("dgrad_dy", np.asarray(dy)), ("dgrad_w", np.asarray(w3))]:
        ov, os_ = oracle.quantize_mx(src)
        np.testing.assert_array_equal(u8(rec[name].values), ov)
        np.testing.assert_array_equal(u8(rec[name].scales), os_)
    # wgrad: tokens of each group start at a multiple of 32 in the padded layout
    starts, pstarts = [0, 37, 37], [0, 64, 64]
    xt = np.zeros((K, rec["wgrad_x"].values.shape[1]), np.float32)
    for g, n in enumerate([37, 0, 20]):
        xt[:, pstarts[g] : pstarts[g] + n] = np.asarray(x)[starts[g] : starts[g] + n].T
    ov, os_ = oracle.quantize_mx(xt)
    np.testing.assert_array_equal(u8(rec["wgrad_x"].values), ov)
    np.testing.assert_array_equal(u8(rec["wgrad_x"].scales), os_)
    # and the gradients are the exact products of those operands (float64 oracle; f32 summation
    # order is the only difference -> 1e-5 relative)
    dyq = oracle.dequant_mx(u8(rec["dgrad_dy"].values), u8(rec["dgrad_dy"].scales))
    wq = oracle.dequant_mx(u8(rec["dgrad_w"].values), u8(rec["dgrad_w"].scales))
    xq = oracle.dequant_mx(u8(rec["wgrad_x"].values), u8(rec["wgrad_x"].scales))
    dytq = oracle.dequant_mx(u8(rec["wgrad_dy"].values), u8(rec["wgrad_dy"].scales))
    want_dx = np.zeros((T, K))
    want_dw = np.zeros((3, K, N))
    for g, n in enumerate([37, 0, 20]):
        s, p = starts[g], pstarts[g]
        want_dx[s : s + n] = dyq[s : s + n] @ wq[g].T
        want_dw[g] = xq[:, p : p + n] @ dytq[:, p : p + n].T
    np.testing.assert_allclose(dx, want_dx, atol=1e-5 * np.abs(want_dx).max())
    np.testing.assert_allclose(dw, want_dw, atol=1e-5 * np.abs(want_dw).max())
    assert np.all(np.asarray(dx)[57:] == 0)


@pytest.mark.parametrize("precision", ["mxfp8", "nvfp4", "nvfp4_per_token_fwd_mxfp8_bwd"])
def test_quantized_grads_match_bf16_within_quantization_error(base, precision):
    x, ws, ct = base
    y0, dx0, dw0 = _out_and_grads(x, ws, GS, ct, "bf16")
    y, dx, dw = _out_and_grads(x, ws, GS, ct, precision)
    # Measured per-operand relative Frobenius error on Gaussian data (benchmarks/quant_error.py):
    # MXFP8 ~0.027, NVFP4 ~0.095. A chain of three GEMMs, each with two quantized operands,
    # compounds to ~sqrt(6) x per-operand error: MXFP8 ~0.07, NVFP4 ~0.23. Bounds: 1.5x that.
    # The gradients additionally see the forward's NVFP4 error through silu' and the product.
    fwd_err = 0.1 if precision == "mxfp8" else 0.35
    assert _rel(y, y0) < fwd_err
    assert _rel(dx, dx0) < fwd_err
    for a, b in zip(dw, dw0):
        assert _rel(a, b) < fwd_err
    assert _rel(y, y0) > 1e-3  # it really quantized


def test_causality_per_tensor_leaks_future_into_past(base):
    x, ws, ct = base
    past = slice(0, 20)
    ct_past = jnp.zeros_like(ct).at[past].set(ct[past])  # loss on past tokens only
    x2 = x.at[50].mul(40.0)  # a FUTURE token with a large activation (new tensor amax)
    for prec, leaks in [("nvfp4", True), ("nvfp4_per_token_fwd_mxfp8_bwd", False), ("mxfp8", False)]:
        y1, dx1, _ = _out_and_grads(x, ws, GS, ct_past, prec)
        y2, dx2, _ = _out_and_grads(x2, ws, GS, ct_past, prec)
        same_y = bool(jnp.array_equal(y1[past], y2[past]))
        same_g = bool(jnp.array_equal(dx1[past], dx2[past]))
        if leaks:
            assert not same_y and not same_g, f"{prec}: future token should change past outputs/grads"
        else:
            assert same_y and same_g, f"{prec}: past outputs/grads must not depend on the future"


def test_batch_sensitivity(base):
    x, ws, ct = base
    # the same 32-token sequence "seq" batched with two different companions (rows 32:64)
    seq = x[:32]
    other_a = x[32:]
    other_b = x[32:] * 5.0
    for prec, sensitive in [("nvfp4", True), ("nvfp4_per_token_fwd_mxfp8_bwd", False)]:
        ya, dxa, _ = _out_and_grads(jnp.concatenate([seq, other_a]), ws, GS, ct, prec)
        yb, dxb, _ = _out_and_grads(jnp.concatenate([seq, other_b]), ws, GS, ct, prec)
        same = bool(jnp.array_equal(ya[:32], yb[:32])) and bool(jnp.array_equal(dxa[:32], dxb[:32]))
        assert same != sensitive, prec


def test_errors():
    x, ws = _inputs()
    with pytest.raises(ValueError, match="precision"):
        qmoe.quantized_ragged_dot(x, ws[0], GS, precision="fp8")
    with pytest.raises(ValueError, match="multiple"):
        qmoe.quantized_ragged_dot(x[:, :48], ws[0][:, :48], GS, precision="mxfp8")
    with pytest.raises(ValueError, match="group_sizes"):
        qmoe.quantized_ragged_dot(x, ws[0], GS[:1], precision="mxfp8")


def test_a_broken_kernel_package_fails_loudly(monkeypatch):
    """The kernel dispatcher loads the `horizon.quant_kernels` entry point; a package that is
    registered but broken raises instead of silently falling back to the reference."""
    import importlib.metadata

    from horizon.quant import matmul as M

    class Broken:
        value = "broken_kernels:KERNELS"

        def load(self):
            raise ImportError("broken_kernels: no module named mosaic")

    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group: [Broken()] if group == M.KERNELS_GROUP else [])
    M.kernel_impl.cache_clear()
    try:
        with pytest.raises(ImportError, match="broken_kernels"):
            M.kernel_impl()
        monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [])
        M.kernel_impl.cache_clear()
        assert M.kernel_impl() is None          # nothing registered: the reference, quietly
    finally:
        monkeypatch.undo()
        M.kernel_impl.cache_clear()
