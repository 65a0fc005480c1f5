"""MoE routing, grouped-GEMM experts, router replay and aux-loss-free bias updates."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_testlib import tiny_cfg

from horizon.model import layers, moe


def _moe_params(cfg, seed=0, bias_scale=0.05):
    p = layers.materialize(jax.random.key(seed), moe.moe_spec(cfg))
    # larger router weights so scores are spread; a nonzero bias changes selection but not gate weights
    p["router"] = p["router"] * 20
    p["router_bias"] = bias_scale * jax.random.normal(jax.random.key(seed + 1), p["router_bias"].shape)
    return p


def _silu(x):
    return x / (1 + np.exp(-x))


def _naive_route(p, x, cfg):
    """Per-token numpy reference of HF DeepseekV3TopkRouter."""
    E, k, G, kg = cfg.num_experts, cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group
    s = 1 / (1 + np.exp(-(x @ np.asarray(p["router"]))))
    u = s + np.asarray(p["router_bias"])
    idx, w = [], []
    for t in range(x.shape[0]):
        ut = u[t].copy()
        if G > 1 and kg < G:
            gsc = [np.sort(ut[g * (E // G):(g + 1) * (E // G)])[-2:].sum() for g in range(G)]
            keep = np.argsort(gsc)[::-1][:kg]
            for g in range(G):
                if g not in keep:
                    ut[g * (E // G):(g + 1) * (E // G)] = -np.inf
        it = np.argsort(-ut, kind="stable")[:k]
        wt = s[t, it]
        if cfg.norm_topk_prob:
            wt = wt / (wt.sum() + 1e-20)
        idx.append(it)
        w.append(wt * cfg.routed_scaling_factor)
    return np.array(idx), np.array(w)


def _naive_moe(p, x, cfg):
    idx, w = _naive_route(p, x, cfg)
    ex = {k: np.asarray(v) for k, v in p["experts"].items()}
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            e = idx[t, j]
            h = _silu(x[t] @ ex["gate"][e]) * (x[t] @ ex["up"][e])
            out[t] += w[t, j] * (h @ ex["down"][e])
    sh = {k: np.asarray(v) for k, v in p["shared"].items()}
    out += (_silu(x @ sh["gate"]) * (x @ sh["up"])) @ sh["down"]
    return out, idx


# float32, highest precision; sums of <= 64 products of O(1) values -> ~1e-6 relative agreement.
TOL = dict(rtol=1e-5, atol=1e-6)


def test_moe_block_matches_naive_reference():
    cfg = tiny_cfg()
    p = _moe_params(cfg)
    x = np.asarray(jax.random.normal(jax.random.key(5), (2, 5, cfg.d_model)))
    y, stats = jax.jit(lambda p, x: moe.moe_block(p, x, cfg=cfg))(p, x)
    ref, ridx = _naive_moe(p, x.reshape(10, -1), cfg)
    np.testing.assert_allclose(np.asarray(y).reshape(10, -1), ref, **TOL)
    np.testing.assert_array_equal(np.sort(np.asarray(stats["indices"]), 1), np.sort(ridx, 1))
    np.testing.assert_array_equal(np.asarray(stats["load"]), np.bincount(ridx.ravel(), minlength=cfg.num_experts))


@pytest.mark.parametrize("E,G,kg,k", [(8, 2, 1, 2), (16, 4, 2, 3), (8, 1, 1, 2)])
def test_group_limited_routing_matches_naive(E, G, kg, k):
    cfg = tiny_cfg()
    cfg.num_experts, cfg.n_group, cfg.topk_group, cfg.num_experts_per_tok = E, G, kg, k
    p = _moe_params(cfg, seed=E + G, bias_scale=0.2)
    x = np.asarray(jax.random.normal(jax.random.key(7), (40, cfg.d_model)))
    w, idx = jax.jit(lambda p, x: moe.route(p, x, cfg=cfg))(p, x)
    ridx, rw = _naive_route(p, x, cfg)
    order = np.argsort(np.asarray(idx), 1)
    rorder = np.argsort(ridx, 1)
    np.testing.assert_array_equal(np.take_along_axis(np.asarray(idx), order, 1), np.take_along_axis(ridx, rorder, 1))
    np.testing.assert_allclose(np.take_along_axis(np.asarray(w), order, 1), np.take_along_axis(rw, rorder, 1), **TOL)
    if kg < G:  # every token's experts lie in at most kg groups
        groups = np.asarray(idx) // (E // G)
        assert max(len(set(r)) for r in groups) <= kg


def test_replay_gradients_reach_router():
    cfg = tiny_cfg()
    p = _moe_params(cfg)
    x = jax.random.normal(jax.random.key(5), (1, 6, cfg.d_model))
    # replay experts the router would not pick by itself: the least-preferred ones
    _, own = moe.route(p, x.reshape(6, -1), cfg=cfg)
    replay = (own + 4) % cfg.num_experts

    def f(p):
        y, st = moe.moe_block(p, x, cfg=cfg, replay_indices=replay)
        return jnp.sum(y ** 2), st

    (_, st), g = jax.jit(jax.value_and_grad(f, has_aux=True))(p)
    np.testing.assert_array_equal(np.asarray(st["indices"]), np.asarray(replay))
    assert float(jnp.abs(g["router"]).max()) > 0
    assert float(jnp.abs(g["router_bias"]).max()) == 0.0  # the bias is selection-only


def test_replaying_own_indices_is_bit_identical(tiny):
    tokens = tiny.tokens(2, 8)
    logits, aux = tiny.full(tokens)
    own = aux["router_indices"]
    # Same compiled function, "no replay" (-1 rows) vs replaying the router's own choice: bit-exact.
    logits_none, aux_none = tiny.forward_replay(tiny.params, tokens, jnp.full_like(own, -1))
    logits_r, aux_r = tiny.forward_replay(tiny.params, tokens, own)
    np.testing.assert_array_equal(np.asarray(logits_r), np.asarray(logits_none))
    np.testing.assert_array_equal(np.asarray(aux_r["router_indices"]), np.asarray(own))
    np.testing.assert_array_equal(np.asarray(aux_none["router_indices"]), np.asarray(own))
    # Versus the separately compiled replay_indices=None program: same math, but XLA may fuse the two
    # programs differently, so equality is only guaranteed to float32 rounding (observed 0 or ~1 ulp).
    np.testing.assert_allclose(np.asarray(logits_r), np.asarray(logits), rtol=0, atol=1e-6)


def test_partial_replay_rows():
    """Rows with -1 keep the router's choice; other rows take the replayed experts."""
    cfg = tiny_cfg()
    p = _moe_params(cfg)
    x = jax.random.normal(jax.random.key(3), (4, cfg.d_model))
    f = jax.jit(lambda p, x, r: moe.route(p, x, cfg=cfg, replay_indices=r))
    _, own = f(p, x, jnp.full((4, 2), -1, jnp.int32))
    rep = jnp.array([[-1, -1], [6, 7], [0, -1], [5, 4]], jnp.int32)
    _, idx = f(p, x, rep)
    np.testing.assert_array_equal(np.asarray(idx), np.asarray(jnp.where(jnp.all(rep >= 0, 1, keepdims=True), rep, own)))


def test_plausibility_filter_hand_case():
    u = jnp.array([
        [0.90, 0.80, 0.10, 0.70, 0.20, 0.50, 0.30, 0.60],  # k-th (2nd) best = 0.8, threshold 0.4
        [0.90, 0.80, 0.10, 0.70, 0.20, 0.50, 0.30, 0.60],
        [0.90, 0.80, 0.10, 0.70, 0.20, 0.50, 0.30, 0.60],
    ])
    replay = jnp.array([[0, 2], [3, 5], [4, 6]], jnp.int32)
    filt = jax.jit(moe.plausibility_filter, static_argnums=3)
    out = filt(replay, u, u, 0.5)
    # row 0: expert 2 (0.1 < 0.4) -> best unchosen = 1. row 1: both >= 0.4, kept.
    # row 2: both implausible -> slot 0 gets 0 (best), slot 1 gets 1 (best not already chosen).
    np.testing.assert_array_equal(np.asarray(out), [[0, 1], [3, 5], [0, 1]])
    # group-limited eligibility: candidates come only from eligible experts
    elig = u.at[:, :2].set(-jnp.inf)
    out2 = filt(replay, u, elig, 0.5)[:1]
    np.testing.assert_array_equal(np.asarray(out2), [[0, 3]])  # 0 is plausible (0.9 >= 0.35); 2 -> 3


def test_route_applies_filter_from_config():
    cfg = tiny_cfg()
    cfg.n_group = cfg.topk_group = 1
    cfg.replay_plausibility_ratio = 0.9
    p = _moe_params(cfg, bias_scale=0.0)
    x = jax.random.normal(jax.random.key(9), (16, cfg.d_model))
    _, own = moe.route(p, x, cfg=cfg)
    worst = jnp.argsort(x @ p["router"], axis=1)[:, :2].astype(jnp.int32)  # two lowest-score experts
    replay = jnp.stack([own[:, 0], worst[:, 0]], 1)
    _, idx = moe.route(p, x, cfg=cfg, replay_indices=replay)
    np.testing.assert_array_equal(np.asarray(idx[:, 0]), np.asarray(own[:, 0]))  # plausible, kept
    np.testing.assert_array_equal(np.asarray(idx[:, 1]), np.asarray(own[:, 1]))  # replaced by the router's 2nd


def test_router_bias_update_direction():
    cfg = tiny_cfg()
    params = {"moe": {"moe": {"router_bias": jnp.zeros((2, 4))}}, "embed": jnp.zeros((3, 2))}
    load = jnp.array([[10.0, 0.0, 5.0, 5.0], [1.0, 1.0, 1.0, 1.0]])  # mean 5 and 1
    new = moe.update_router_bias(params, load, cfg)
    r = cfg.router_bias_update_rate
    np.testing.assert_allclose(np.asarray(new["moe"]["moe"]["router_bias"]), [[-r, r, 0, 0], [0, 0, 0, 0]])
    assert float(jnp.abs(params["moe"]["moe"]["router_bias"]).max()) == 0  # input not mutated
    with pytest.raises(ValueError, match="router_load shape"):
        moe.update_router_bias(params, load[:1], cfg)


def test_expert_matmul_precisions():
    x = jnp.ones((4, 3))
    w = jnp.ones((2, 3, 5))
    gs = jnp.array([1, 3], jnp.int32)
    np.testing.assert_allclose(np.asarray(moe.expert_matmul(x, w, gs, precision="bf16")), 3.0)
    # Block-scaled recipes dispatch to horizon.quant (K, N multiples of 32 there): ones are exact in MXFP8.
    xq, wq = jnp.ones((4, 32)), jnp.ones((2, 32, 32))
    np.testing.assert_allclose(np.asarray(moe.expert_matmul(xq, wq, gs, precision="mxfp8")), 32.0)
    with pytest.raises(ValueError, match="unknown moe_precision"):
        moe.expert_matmul(x, w, gs, precision="fp2")
