"""MTP: shifting/validity, self-distillation KL, and the freeze_trunk gradient contract."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_testlib import tiny_cfg

from horizon.model import mtp, transformer


def test_valid_mask_shift_and_segments():
    tokens = jnp.zeros((1, 8), jnp.int32)
    seg = jnp.array([[0, 0, 0, 0, 0, 1, 1, 1]])
    v = np.asarray(mtp.mtp_valid_mask(tokens, 2, seg))
    # depth 1: position t predicts t+2; depth 2: t+3. Valid iff target exists and is in t's segment.
    np.testing.assert_array_equal(v[0, 0], [1, 1, 1, 0, 0, 1, 0, 0])
    np.testing.assert_array_equal(v[1, 0], [1, 1, 0, 0, 0, 0, 0, 0])


def test_kl_zero_when_mtp_equals_shifted_main():
    """The student at t equal to the main head at t+k (same hidden, same norm): KL 0; otherwise > 0;
    invalid positions are ignored."""
    c = _mtp_cfg()
    c.mtp_depth = 2
    params = transformer.init(jax.random.key(0), c)
    params["mtp"]["head_norm"] = jnp.broadcast_to(params["final_norm"], params["mtp"]["head_norm"].shape)
    rng = np.random.default_rng(0)
    b, s, K, D = 2, 6, 2, c.d_model
    main = jnp.asarray(rng.standard_normal((b, s, D)), jnp.float32)
    mtp_h = jnp.stack([jnp.concatenate([main[:, k:], jnp.zeros((b, k, D))], 1) for k in (1, 2)])
    mask = mtp.mtp_valid_mask(jnp.zeros((b, s), jnp.int32), K)
    kl = jax.jit(functools.partial(mtp.mtp_loss, cfg=c))
    loss, per = kl(params, main, mtp_h, mask)
    assert abs(float(loss)) < 1e-6 and per.shape == (K,)
    loss2, _ = kl(params, main, mtp_h + 5 * jnp.asarray(rng.standard_normal(mtp_h.shape), jnp.float32), mask)
    assert float(loss2) > 1e-3
    # invalid positions are ignored: garbage there does not matter
    garbage = jnp.where(mask[..., None], mtp_h, 100.0 * jnp.arange(D))
    assert abs(float(kl(params, main, garbage, mask)[0])) < 1e-6


def _mtp_cfg():
    c = tiny_cfg()
    c.num_layers = 1
    c.num_experts = 0  # small all-dense trunk and dense MTP blocks (cheap to compile)
    c.mtp_depth = 1
    return c


@functools.cache
def _grads(freeze: bool):
    c = _mtp_cfg()
    params = transformer.init(jax.random.key(0), c)
    tokens = jax.random.randint(jax.random.key(1), (2, 8), 0, c.vocab_size)

    def loss(p):
        hidden, _ = transformer.hidden_states(p, tokens, cfg=c)
        mh, valid = mtp.mtp_hidden(p, hidden, tokens, cfg=c, freeze_trunk=freeze)
        return mtp.mtp_loss(p, hidden, mh, valid, cfg=c, freeze_trunk=freeze)[0]

    return jax.jit(jax.grad(loss))(params)


def _maxabs(tree):
    return max(float(jnp.abs(x).max()) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("freeze", [True, False])
def test_freeze_trunk_gradients(freeze):
    g = _grads(freeze)
    trunk = {k: v for k, v in g.items() if k != "mtp"}
    assert _maxabs(g["mtp"]) > 0
    if freeze:
        assert _maxabs(trunk) == 0.0
    else:
        assert _maxabs(g["dense"]) > 0 and _maxabs(g["embed"]) > 0


def test_mtp_hidden_shapes_variant(variant):
    """MoE-block MTP on the variant config (YaRN, full-rank q); also checks segment-aware validity."""
    tokens = variant.tokens(2, 8)
    _, aux = variant.full(tokens)
    seg = jnp.array([[0, 0, 0, 0, 1, 1, 1, 1]] * 2)
    mh, valid = jax.jit(lambda p, h, t, s: mtp.mtp_hidden(p, h, t, cfg=variant.cfg, segment_ids=s))(
        variant.params, aux["hidden"], tokens, seg)
    assert mh.shape == (1, 2, 8, variant.cfg.d_model) and mh.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(valid[0, 0]), [1, 1, 0, 0, 1, 1, 0, 0])
    assert bool(jnp.isfinite(mh).all())
