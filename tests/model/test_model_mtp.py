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
    rng = np.random.default_rng(0)
    b, s, V, K = 2, 6, 11, 2
    main = jnp.asarray(rng.standard_normal((b, s, V)), jnp.float32)
    mtp_l = jnp.stack([jnp.concatenate([main[:, k:], jnp.zeros((b, k, V))], 1) for k in (1, 2)])
    mask = mtp.mtp_valid_mask(jnp.zeros((b, s), jnp.int32), K)
    kl = jax.jit(mtp.mtp_loss)
    loss, per = kl(main, mtp_l, mask)
    assert abs(float(loss)) < 1e-6 and per.shape == (K,)
    loss2, _ = kl(main, mtp_l + jnp.asarray(rng.standard_normal(mtp_l.shape), jnp.float32), mask)
    assert float(loss2) > 0.1
    # invalid positions are ignored: garbage there does not matter
    garbage = jnp.where(mask[..., None], mtp_l, 100.0 * jnp.arange(V))
    assert abs(float(kl(main, garbage, mask)[0])) < 1e-6


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
        logits, aux = transformer.forward(p, tokens, cfg=c)
        ml, valid = mtp.mtp_logits(p, aux["hidden"], tokens, cfg=c, freeze_trunk=freeze)
        return mtp.mtp_loss(logits, ml, valid)[0]

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


def test_mtp_logits_shapes_variant(variant):
    """MoE-block MTP on the variant config (YaRN, full-rank q); also checks segment-aware validity."""
    tokens = variant.tokens(2, 8)
    _, aux = variant.full(tokens)
    seg = jnp.array([[0, 0, 0, 0, 1, 1, 1, 1]] * 2)
    ml, valid = jax.jit(lambda p, h, t, s: mtp.mtp_logits(p, h, t, cfg=variant.cfg, segment_ids=s))(
        variant.params, aux["hidden"], tokens, seg)
    assert ml.shape == (1, 2, 8, variant.cfg.vocab_size) and ml.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(valid[0, 0]), [1, 1, 0, 0, 1, 1, 0, 0])
    assert bool(jnp.isfinite(ml).all())
