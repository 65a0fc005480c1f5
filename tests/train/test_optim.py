"""Optimizer masks and schedule (docs/SPEC.md §8): router_bias never touched by Adam; no decay on norms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from horizon.model import transformer
from horizon.train import optim


def test_masks_router_bias_and_norms(cfg):
    params = transformer.init(jax.random.PRNGKey(0), cfg.model)
    cfg.train.weight_decay = 0.5
    tx = optim.make_optimizer(cfg.train, transformer.trainable_mask(params))
    state = tx.init(params)
    update = jax.jit(tx.update)  # eager optax updates dispatch hundreds of tiny ops: slow on CPU
    # No Adam moments are allocated for router_bias.
    n_moment_leaves = len(jax.tree.leaves(state))
    n_params = len(jax.tree.leaves(params))
    assert n_moment_leaves == 2 * (n_params - 1) + 1 + 1  # mu, nu over all but router_bias, 2 counts

    # Zero gradients: only weight decay can move a parameter.
    zeros = jax.tree.map(jnp.zeros_like, params)
    for _ in range(3):  # past step 0 (lr 0 at the start of warmup)
        upd, state = update(zeros, state, params)
    assert not np.any(upd["final_norm"]) and not np.any(upd["dense"]["attn_norm"])
    assert not np.any(upd["moe"]["attn"]["kv_norm"])
    assert np.abs(upd["embed"]).max() > 0 and np.abs(upd["dense"]["mlp"]["gate"]).max() > 0

    # Large gradients everywhere: router_bias still gets exactly zero update.
    ones = jax.tree.map(jnp.ones_like, params)
    upd, state = update(ones, state, params)
    assert not np.any(upd["moe"]["moe"]["router_bias"])
    assert np.abs(upd["moe"]["moe"]["router"]).max() > 0


def test_decay_mask_by_name():
    tree = {"a_norm": jnp.ones((3, 4)), "w": jnp.ones((4, 4)), "router_bias": jnp.ones(4),
            "x": {"kv_norm": jnp.ones(2)}}
    m = optim.decay_mask(tree)
    assert m == {"a_norm": False, "w": True, "router_bias": False, "x": {"kv_norm": False}}


def test_clip_uses_trainable_grads_only(cfg):
    # A huge gradient on the frozen leaf must not shrink the (clipped) update of trainable leaves.
    params = {"w": jnp.ones(4), "router_bias": jnp.zeros(4)}
    tx = optim.make_optimizer(cfg.train, {"w": True, "router_bias": False}, schedule=lambda _: 1.0)
    st = tx.init(params)
    u1, _ = tx.update({"w": jnp.full(4, 0.1), "router_bias": jnp.zeros(4)}, st, params)
    u2, _ = tx.update({"w": jnp.full(4, 0.1), "router_bias": jnp.full(4, 1e6)}, st, params)
    np.testing.assert_array_equal(u1["w"], u2["w"])


def test_schedule(cfg):
    cfg.train.update(steps=100, warmup_steps=10, lr=1e-2, min_lr_ratio=0.1)
    s = optim.lr_schedule(cfg.train)
    assert float(s(0)) == 0.0
    np.testing.assert_allclose(float(s(10)), 1e-2, rtol=1e-6)   # peak at end of warmup
    np.testing.assert_allclose(float(s(100)), 1e-3, rtol=1e-6)  # min_lr_ratio * lr at the end
    assert float(s(50)) < float(s(20))
    cfg.train.warmup_steps = 100
    with pytest.raises(ValueError, match="warmup_steps"):
        optim.lr_schedule(cfg.train)
