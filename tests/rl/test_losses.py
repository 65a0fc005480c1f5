"""Tests for horizon.rl.algo.losses (docs/SPEC.md §4): hand-computed values, length weighting, KL gradients."""

import dataclasses
import math
import statistics

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from horizon.rl.algo import losses as L
from horizon.utils.config import load_config_file

# Hand-computed values below are exact in f32 up to rounding: 1e-6 absolute.
ATOL = 1e-6


# ----------------------------------------------------------------------------- advantages
def test_group_advantages_mean_only_by_default():
    r = jnp.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    adv = L.group_advantages(r, group_size=4)
    np.testing.assert_allclose(adv, [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0], atol=ATOL)
    # 2-D input gives the same numbers in the same shape.
    adv2 = L.group_advantages(r.reshape(2, 4))
    assert adv2.shape == (2, 4)
    np.testing.assert_allclose(adv2.reshape(-1), adv, atol=ATOL)
    # std normalisation only when asked: group 1 has population std 0.5 -> ±1; group 2 stays 0.
    adv_std = L.group_advantages(r, group_size=4, std_normalize=True, std_unbiased=False, eps=0.0 + 1e-12)
    np.testing.assert_allclose(adv_std, [1, -1, -1, 1, 0, 0, 0, 0], atol=1e-5)
    assert not np.allclose(adv_std, adv)
    # default: the unbiased std sqrt(1/3) -> ±sqrt(3)/2
    adv_unb = L.group_advantages(r, group_size=4, std_normalize=True, eps=0.0)
    np.testing.assert_allclose(adv_unb, np.array([1, -1, -1, 1, 0, 0, 0, 0]) * math.sqrt(3) / 2, atol=1e-5)


def _verl_grpo(scores: np.ndarray, index: list[int], eps: float) -> np.ndarray:
    """verl `compute_grpo_outcome_advantage` (norm_adv_by_std_in_grpo=True) for groups of >= 2:
    ``(score - mean) / (torch.std(unbiased) + eps)``, per prompt index, written out per sample."""
    out = np.zeros(len(scores))
    for i, g in enumerate(index):
        members = [float(s) for s, h in zip(scores, index) if h == g]
        out[i] = (scores[i] - statistics.mean(members)) / (statistics.stdev(members) + eps)
    return out


@pytest.mark.parametrize("group_size", [2, 3, 8])
def test_group_std_normalize_is_unbiased_like_verl(group_size):
    """GRPO's std is the unbiased one (ddof=1), as verl / TRL (torch.std)."""
    rng = np.random.default_rng(group_size)
    r = rng.normal(size=(5, group_size)).astype(np.float32)
    eps = 1e-6
    adv = np.asarray(L.group_advantages(r, std_normalize=True, eps=eps))
    want = (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + eps)
    np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-6)
    verl = _verl_grpo(r.reshape(-1), [i // group_size for i in range(r.size)], eps)
    np.testing.assert_allclose(adv.reshape(-1), verl, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(L.group_std(jnp.asarray(r)), r.std(1, ddof=1, keepdims=True), rtol=1e-5)
    # the population option is still there
    pop = np.asarray(L.group_advantages(r, std_normalize=True, std_unbiased=False, eps=eps))
    np.testing.assert_allclose(pop, (r - r.mean(1, keepdims=True)) / (r.std(1, keepdims=True) + eps),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pop, adv * math.sqrt(group_size / (group_size - 1)), rtol=1e-4, atol=1e-6)
    jitted = jax.jit(lambda x: L.group_advantages(x, std_normalize=True, eps=eps))(r)
    np.testing.assert_allclose(jitted, adv, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("std_unbiased", [True, False])
@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_group_of_one_has_zero_advantage(std_unbiased, eps):
    r = jnp.array([3.0, -1.0, 0.5])
    for adv in (L.group_advantages(r, group_size=1, std_normalize=True, std_unbiased=std_unbiased, eps=eps),
                L.group_advantages(r.reshape(3, 1), std_normalize=True, std_unbiased=std_unbiased, eps=eps),
                L.group_advantages(r, group_size=1)):
        assert np.all(np.isfinite(adv)) and np.all(np.asarray(adv) == 0)
    # an all-equal group with eps=0: 0, not NaN
    same = L.group_advantages(jnp.ones((2, 4)), std_normalize=True, std_unbiased=std_unbiased, eps=eps)
    assert np.all(np.asarray(same) == 0)


def test_group_advantages_errors():
    with pytest.raises(ValueError, match="group_size"):
        L.group_advantages(jnp.ones(6))
    with pytest.raises(ValueError, match="divisible"):
        L.group_advantages(jnp.ones(6), group_size=4)
    with pytest.raises(ValueError, match="shape"):
        L.group_advantages(jnp.ones((2, 3)), group_size=4)


def test_broadcast_chain_advantages():
    # Chains: 3 prompts x 2 chains; chain rewards -> per-prompt baseline over chains.
    chain_rewards = jnp.array([1.0, 0.0, 0.0, 0.0, 0.5, 1.5])
    chain_adv = L.group_advantages(chain_rewards, group_size=2)
    np.testing.assert_allclose(chain_adv, [0.5, -0.5, 0, 0, -0.5, 0.5], atol=ATOL)
    # Chain 0 has three segments (rows 0, 1, 4), chain 5 one, row 5 is padding.
    rows = jnp.array([0, 0, 1, 5, 0, -1])
    out = L.broadcast_chain_advantages(chain_adv, rows)
    np.testing.assert_allclose(out, [0.5, 0.5, -0.5, 0.5, 0.5, 0.0], atol=ATOL)
    with pytest.raises(ValueError, match="out of range"):
        L.broadcast_chain_advantages(chain_adv, jnp.array([6]))
    with pytest.raises(ValueError, match="integer"):
        L.broadcast_chain_advantages(chain_adv, jnp.array([0.0]))
    # jit works (no range check on tracers).
    np.testing.assert_allclose(jax.jit(L.broadcast_chain_advantages)(chain_adv, rows), out, atol=ATOL)


def test_later_segments_sum():
    vals = jnp.array([1.0, 2.0, 4.0, 8.0, 16.0])
    chain = jnp.array([0, 0, 1, 0, -1])
    seg = jnp.array([0, 1, 0, 2, 0])
    # row0: later segs of chain 0 = rows 1, 3 -> 10; row1: row 3 -> 8; others 0.
    np.testing.assert_allclose(L.later_segments_sum(vals, chain, seg), [10, 8, 0, 0, 0], atol=ATOL)


# ----------------------------------------------------------------------------- pg loss values
def _on_policy(lp):
    return lp, jax.lax.stop_gradient(lp)


def test_pg_loss_aggregations_hand_values():
    lp = jnp.full((2, 3), -1.0)
    adv = jnp.array([1.0, -2.0])
    mask = jnp.array([[1, 1, 0], [1, 1, 1]], bool)
    # ratio = 1: token_sum = -(1*2 + -2*3)/2 = 2; seq_mean = -(1 + -2)/2 = 0.5;
    # token_mean = -(2 - 6)/5 = 0.8.
    for agg, want in (("token_sum", 2.0), ("seq_mean", 0.5), ("token_mean", 0.8)):
        loss, met = L.policy_gradient_loss(lp, lp, adv, mask, L.LossConfig(agg=agg))
        assert abs(float(loss) - want) < ATOL, agg
        assert float(met["num_tokens"]) == 5
        assert float(met["clip_frac"]) == 0
    loss, _ = L.policy_gradient_loss(lp, lp, adv, mask, L.LossConfig(token_sum_norm=4.0))
    assert abs(float(loss) - 1.0) < ATOL


def test_pg_loss_ratio_and_clip_hand_values():
    # Tokens with ratios 1.5, 0.5, 0.5 and advantages +1, +1, -1 (one row each).
    samp = jnp.zeros((3, 1))
    lp = jnp.log(jnp.array([[1.5], [0.5], [0.5]]))
    adv = jnp.array([1.0, 1.0, -1.0])
    mask = jnp.ones((3, 1))
    loss, met = L.policy_gradient_loss(lp, samp, adv, mask)
    # unclipped: -(1.5 + 0.5 - 0.5)/3 = -0.5
    assert abs(float(loss) + 0.5) < 1e-6
    assert abs(float(met["ratio_max"]) - 1.5) < 1e-6
    loss_c, met_c = L.policy_gradient_loss(lp, samp, adv, mask, L.LossConfig(clip_eps=0.2))
    # clipped: min(1.5, 1.2)=1.2 (binds), min(0.5, 0.8)=0.5, min(-0.5, -0.8)=-0.8 (binds)
    assert abs(float(loss_c) + (1.2 + 0.5 - 0.8) / 3) < 1e-6
    assert abs(float(met_c["clip_frac"]) - 2 / 3) < 1e-6
    # Gradient: d/dlogp of ratio*A is ratio*A; clipped tokens get none.
    g = jax.grad(lambda x: L.policy_gradient_loss(x, samp, adv, mask, L.LossConfig(clip_eps=0.2))[0])(lp)
    np.testing.assert_allclose(g[:, 0], [0.0, -0.5 / 3, 0.0], atol=1e-6)
    # Denominator is stop-gradient: no gradient flows into sampler_logprobs.
    gs = jax.grad(lambda s: L.policy_gradient_loss(lp, s, adv, mask)[0])(samp)
    np.testing.assert_allclose(gs, 0.0, atol=0)


def test_pg_loss_length_doubling():
    """token_sum: doubling a response's length doubles its gradient weight (no length norm)."""
    lp = jnp.full((2, 4), -0.7)
    adv = jnp.array([1.0, 1.0])
    mask = jnp.array([[1, 1, 0, 0], [1, 1, 1, 1]], bool)

    def row_weight(agg):
        cfg = L.LossConfig(agg=agg)
        g = jax.grad(lambda x: L.policy_gradient_loss(x, jax.lax.stop_gradient(x), adv, mask, cfg)[0])(lp)
        return np.asarray(-g.sum(axis=1))

    w = row_weight("token_sum")
    np.testing.assert_allclose(w[1] / w[0], 2.0, rtol=1e-6)
    np.testing.assert_allclose(w, [2 / 2, 4 / 2], rtol=1e-6)  # per token weight 1/R, R = 2 rows
    w = row_weight("seq_mean")  # GRPO: every sequence gets the same total weight
    np.testing.assert_allclose(w, [0.5, 0.5], rtol=1e-6)
    w = row_weight("token_mean")  # DAPO: per-token weight 1/total tokens
    np.testing.assert_allclose(w, [2 / 6, 4 / 6], rtol=1e-6)


def test_overlong_mask_off_by_default_and_drops_rows():
    lp = jnp.zeros((2, 2))
    adv = jnp.array([1.0, 3.0])
    mask = jnp.ones((2, 2))
    trunc = jnp.array([False, True])
    loss, _ = L.policy_gradient_loss(lp, lp, adv, mask, truncated=trunc)
    assert abs(float(loss) + (2 + 6) / 2) < ATOL  # flag ignored when overlong_mask is off
    loss, met = L.policy_gradient_loss(lp, lp, adv, mask, L.LossConfig(overlong_mask=True), truncated=trunc)
    assert abs(float(loss) + 2 / 2) < ATOL
    assert float(met["num_tokens"]) == 2
    with pytest.raises(ValueError, match="truncated"):
        L.policy_gradient_loss(lp, lp, adv, mask, L.LossConfig(overlong_mask=True))


def test_pg_loss_validation():
    lp = jnp.zeros((2, 3))
    ok = dict(sampler_logprobs=lp, advantages=jnp.zeros(2), mask=jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="loss_agg"):
        L.LossConfig(agg="sum")
    with pytest.raises(ValueError, match="kl_mode"):
        L.LossConfig(kl_mode="x", kl_coef=1.0)
    with pytest.raises(ValueError, match="kl_estimator"):
        L.LossConfig(kl_estimator="k4")
    with pytest.raises(ValueError, match="kl_coef"):
        L.LossConfig(kl_coef=-0.1)
    with pytest.raises(ValueError, match="clip_eps"):
        L.LossConfig(clip_eps=-0.2)
    with pytest.raises(ValueError, match="ref_logprobs"):
        L.policy_gradient_loss(lp, **ok, config=L.LossConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="row_segment_index"):
        L.policy_gradient_loss(lp, **ok, row_chain_index=jnp.zeros(2, jnp.int32))
    with pytest.raises(ValueError, match="advantages"):
        L.policy_gradient_loss(lp, lp, jnp.zeros(3), jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="mask shape"):
        L.policy_gradient_loss(lp, lp, jnp.zeros(2), jnp.ones((2, 2)))


def test_jit_and_loss_config():
    cfg = load_config_file("configs/rl_tiny.py").rl
    lc = L.loss_config(cfg)
    assert lc.agg == "token_sum" and lc.kl_estimator == "k1" and lc.clip_eps is None and lc.token_sum_norm is None
    assert lc.kl_coef == float(cfg.kl_coef) and lc.kl_mode == cfg.kl_mode
    assert cfg.std_normalize is False and cfg.overlong_mask is False and lc.overlong_mask is False
    # frozen and hashable by value: a static value the jitted step can close over
    assert lc == L.loss_config(cfg) and hash(lc) == hash(L.loss_config(cfg))
    assert jax.jit(lambda x, c: x, static_argnums=1)(1.0, lc) == 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        lc.kl_coef = 0.0
    lp = -jnp.arange(6, dtype=jnp.float32).reshape(2, 3) / 10
    args = (lp, lp + 0.01, jnp.array([0.5, -0.5]), jnp.ones((2, 3)))
    f = jax.jit(lambda *a: L.policy_gradient_loss(*a, lc, ref_logprobs=lp - 0.1))
    loss_j, met_j = f(*args)
    loss, met = L.policy_gradient_loss(*args, lc, ref_logprobs=lp - 0.1)
    assert abs(float(loss_j) - float(loss)) < 1e-6
    assert abs(float(met_j["kl_k1"]) - 0.1) < 1e-6


# ----------------------------------------------------------------------------- KL values
def test_kl_estimator_hand_values():
    logq = jnp.array([0.0])
    logp = jnp.log(jnp.array([0.5]))  # r = 0.5
    assert abs(float(L.kl_estimate(logq, logp, "k1")[0]) - math.log(2)) < 1e-6
    assert abs(float(L.kl_estimate(logq, logp, "k2")[0]) - 0.5 * math.log(2) ** 2) < 1e-6
    assert abs(float(L.kl_estimate(logq, logp, "k3")[0]) - (-0.5 + math.log(2))) < 1e-6
    with pytest.raises(ValueError):
        L.kl_estimate(logq, logp, "k9")


def test_kl_penalty_reward_to_go_hand_values():
    """With ratio 1 the loss value shows the per-token advantage A_t - β·pen_t."""
    lp = jnp.zeros((1, 3))
    ref = -jnp.array([[0.1, 0.2, 0.3]])  # k1 = [0.1, 0.2, 0.3]
    def kl(mode):
        return L.LossConfig(kl_coef=1.0, kl_mode=mode)

    loss, met = L.policy_gradient_loss(lp, lp, jnp.ones(1), jnp.ones((1, 3)), kl("reward"), ref_logprobs=ref)
    # reward-to-go [0.6, 0.5, 0.3]: -(0.4 + 0.5 + 0.7) = -1.6
    assert abs(float(loss) + 1.6) < 1e-6
    assert abs(float(met["kl_k1"]) - 0.2) < 1e-6
    loss, _ = L.policy_gradient_loss(lp, lp, jnp.ones(1), jnp.ones((1, 3)), kl("reward_token"), ref_logprobs=ref)
    assert abs(float(loss) + 2.4) < 1e-6  # -(0.9 + 0.8 + 0.7)
    loss, met = L.policy_gradient_loss(lp, lp, jnp.ones(1), jnp.ones((1, 3)), kl("loss"), ref_logprobs=ref)
    assert abs(float(loss) - (-3.0 + 0.6)) < 1e-6  # pg -3, KL term +0.6
    assert abs(float(met["kl_loss"]) - 0.6) < 1e-6
    # Masked tokens carry no penalty: only the first two count, reward-to-go [0.3, 0.2].
    m = jnp.array([[1, 1, 0]], bool)
    loss, _ = L.policy_gradient_loss(lp, lp, jnp.ones(1), m, kl("reward"), ref_logprobs=ref)
    assert abs(float(loss) + (0.7 + 0.8)) < 1e-6


# ----------------------------------------------------------------------------- KL gradients (MC)
# Monte-Carlo checks: per-sample gradient estimates g_i; their mean must lie within
# Z_TOL standard errors (std(g_i)/sqrt(N), per parameter) of the analytic gradient.
# Seeds are fixed so the test is deterministic; Z_TOL = 4.5 would fail a correct
# estimator with probability < 1e-4 even over all parameters at a fresh seed.
# "Biased" checks require a gap of > 10 standard errors in some parameter.
N_MC = 8000
Z_TOL = 4.5
Z_BIAS = 10.0

THETA = jnp.array([0.5, -0.3, 1.0, 0.0, -1.0])   # q logits (trained)
PHI = jnp.array([-0.5, 0.8, 0.0, 0.3, 0.2])      # p logits (reference)


def _exact_kl(logq, logp):
    return jnp.sum(jnp.exp(logq) * (logq - logp))


def _mc_stats(per_sample_grad, samples):
    @jax.jit
    def stats(samples):
        g = jax.vmap(per_sample_grad)(samples)  # [N, P]
        return g.mean(0), g.std(0, ddof=1) / math.sqrt(g.shape[0])
    mean, se = stats(samples)
    return np.asarray(mean), np.asarray(se)


def _bandit_grad_fn(estimator, mode):
    def loss_one(theta, x):
        lq = jax.nn.log_softmax(theta)[x].reshape(1, 1)
        ref = jax.nn.log_softmax(PHI)[x].reshape(1, 1)
        loss, _ = L.policy_gradient_loss(
            lq, jax.lax.stop_gradient(lq), jnp.zeros(1), jnp.ones((1, 1)),
            L.LossConfig(kl_coef=1.0, kl_estimator=estimator, kl_mode=mode), ref_logprobs=ref)
        return loss
    return lambda x: jax.grad(loss_one)(THETA, x)


@pytest.fixture(scope="module")
def bandit_samples():
    return jax.random.categorical(jax.random.PRNGKey(0), THETA, shape=(N_MC,))


@pytest.fixture(scope="module")
def bandit_targets():
    kl_qp = jax.grad(lambda t: _exact_kl(jax.nn.log_softmax(t), jax.nn.log_softmax(PHI)))(THETA)
    kl_pq = jax.grad(lambda t: _exact_kl(jax.nn.log_softmax(PHI), jax.nn.log_softmax(t)))(THETA)
    return np.asarray(kl_qp), np.asarray(kl_pq)


def _assert_matches(mean, se, target):
    z = np.abs(mean - target) / (se + 1e-12)
    assert np.all(z < Z_TOL), f"mean {mean} target {target} z {z}"


def _assert_differs(mean, se, target):
    z = np.abs(mean - target) / (se + 1e-12)
    assert np.max(z) > Z_BIAS, f"estimator unexpectedly matches: mean {mean} target {target} z {z}"


def test_kl_reward_mode_k1_gradient_is_unbiased(bandit_samples, bandit_targets):
    kl_qp, _ = bandit_targets
    assert np.max(np.abs(kl_qp)) > 0.1  # the target is far from zero
    for mode in ("reward", "reward_token"):  # identical for one-token sequences
        mean, se = _mc_stats(_bandit_grad_fn("k1", mode), bandit_samples)
        _assert_matches(mean, se, kl_qp)
    # Batched loss (rows = samples, token_sum / R = mean) gives the same mean gradient.
    x = bandit_samples
    def batch_loss(theta):
        lq = jax.nn.log_softmax(theta)[x][:, None]
        ref = jax.nn.log_softmax(PHI)[x][:, None]
        return L.policy_gradient_loss(lq, jax.lax.stop_gradient(lq), jnp.zeros(N_MC), jnp.ones_like(lq),
                                      L.LossConfig(kl_coef=1.0), ref_logprobs=ref)[0]
    np.testing.assert_allclose(jax.jit(jax.grad(batch_loss))(THETA), mean, atol=1e-5)


def test_kl_naive_loss_mode_is_biased(bandit_samples, bandit_targets):
    kl_qp, kl_pq = bandit_targets
    # k1 as a plain loss term: expected gradient E_q[∇log q] = 0, not ∇KL.
    mean, se = _mc_stats(_bandit_grad_fn("k1", "loss"), bandit_samples)
    _assert_matches(mean, se, np.zeros_like(kl_qp))
    _assert_differs(mean, se, kl_qp)
    # k3 as a plain loss term: expected gradient is ∇KL(p||q), the other direction.
    mean, se = _mc_stats(_bandit_grad_fn("k3", "loss"), bandit_samples)
    _assert_matches(mean, se, kl_pq)
    _assert_differs(mean, se, kl_qp)
    # k2 as a plain loss term: ∇k2 = k1·∇log q, so its expectation is ∇KL(q||p).
    mean, se = _mc_stats(_bandit_grad_fn("k2", "loss"), bandit_samples)
    _assert_matches(mean, se, kl_qp)


def test_kl_reward_mode_k3_is_biased(bandit_samples, bandit_targets):
    kl_qp, _ = bandit_targets
    mean, se = _mc_stats(_bandit_grad_fn("k3", "reward"), bandit_samples)
    _assert_differs(mean, se, kl_qp)


# Two-step autoregressive policy over 3 tokens: q(y1) q(y2|y1). The step-2 KL is large only
# after y1 = 0, so the sequence-KL gradient on the y1 logits needs the reward-to-go.
V = 3
TH1 = jnp.array([0.2, 0.0, -0.2])
TH2 = jnp.array([[3.0, -3.0, 0.0], [0.1, 0.0, 0.0], [0.0, 0.2, 0.0]])
PH1 = jnp.array([0.0, 0.3, 0.0])
PH2 = jnp.zeros((V, V))


def _seq_exact_kl(params):
    th1, th2 = params
    lq1, lq2 = jax.nn.log_softmax(th1), jax.nn.log_softmax(th2, axis=-1)
    lp1, lp2 = jax.nn.log_softmax(PH1), jax.nn.log_softmax(PH2, axis=-1)
    lq = lq1[:, None] + lq2
    lp = lp1[:, None] + lp2
    return jnp.sum(jnp.exp(lq) * (lq - lp))


def _two_step_logprobs(params, y):
    th1, th2 = params
    lq = jnp.stack([jax.nn.log_softmax(th1)[y[0]], jax.nn.log_softmax(th2[y[0]])[y[1]]])
    lp = jnp.stack([jax.nn.log_softmax(PH1)[y[0]], jax.nn.log_softmax(PH2[y[0]])[y[1]]])
    return lq, lp


@pytest.fixture(scope="module")
def two_step():
    @jax.jit
    def sample(key):
        k1, k2 = jax.random.split(key)
        y1 = jax.random.categorical(k1, TH1, shape=(N_MC,))
        return jnp.stack([y1, jax.random.categorical(k2, TH2[y1])], axis=1)
    ys = sample(jax.random.PRNGKey(1))
    target, _ = ravel_pytree(jax.grad(_seq_exact_kl)((TH1, TH2)))
    return ys, np.asarray(target)


def _two_step_grad_fn(mode, as_segments=False):
    def loss_one(params, y):
        lq, lp = _two_step_logprobs(params, y)
        if as_segments:  # each token its own row (segment) of one chain
            lq, lp = lq[:, None], lp[:, None]
            extra = dict(row_chain_index=jnp.array([0, 0]), row_segment_index=jnp.array([0, 1]))
            cfg = L.LossConfig(kl_coef=1.0, kl_mode=mode, token_sum_norm=1.0)
        else:
            lq, lp = lq[None], lp[None]
            extra = {}
            cfg = L.LossConfig(kl_coef=1.0, kl_mode=mode)
        loss, _ = L.policy_gradient_loss(
            lq, jax.lax.stop_gradient(lq), jnp.zeros(lq.shape[0]), jnp.ones_like(lq), cfg, ref_logprobs=lp, **extra)
        return loss
    return lambda y: ravel_pytree(jax.grad(loss_one)((TH1, TH2), y))[0]


def test_kl_sequence_gradient_needs_reward_to_go(two_step):
    ys, target = two_step
    mean, se = _mc_stats(_two_step_grad_fn("reward"), ys)
    _assert_matches(mean, se, target)
    # Summary-chain form: the two tokens as two segment rows of one chain.
    mean_seg, se_seg = _mc_stats(_two_step_grad_fn("reward", as_segments=True), ys)
    np.testing.assert_allclose(mean_seg, mean, atol=1e-5)
    # Per-token penalty misses E[∇log q(y1) · k1_2]: biased for the sequence KL.
    mean, se = _mc_stats(_two_step_grad_fn("reward_token"), ys)
    _assert_differs(mean, se, target)


def test_mean_group_max_is_best_of_k_and_pass_at_n():
    """One best-of-K: the trainer's metric and the eval's held-out best-of-passes are
    `mean_group_max`; on 0/1 success it equals the unbiased pass@k at k = n."""
    from horizon.eval.harness import pass_at_k

    rng = np.random.default_rng(0)
    solved = (rng.random((7, 4)) < 0.3).astype(np.float32)          # 7 tasks x 4 passes
    want = np.mean([pass_at_k(4, int(s.sum()), 4) for s in solved])
    assert float(L.mean_group_max(solved)) == pytest.approx(want)
    r = jnp.asarray(rng.random((5, 3)), jnp.float32)
    valid = jnp.asarray([1, 1, 0, 1, 0], jnp.float32)                 # padding groups do not count
    assert float(L.mean_group_max(r, valid)) == pytest.approx(float(r.max(axis=1)[jnp.array([0, 1, 3])].mean()))


# ----------------------------------------------------------------------------- stale tokens (docs/SPEC.md §4.1)
# Five rows of loss-token ratios r = exp(logprobs - sampler_logprobs) that straddle the caps below
# (token band [1/3, 3], TIS cap 2, geometric-mean band [2/3, 1.5]); "x" = not a loss token.
#   row 0  1.25 0.9  2.5  1.1  x     geo 1.33 (kept)   2.5 TIS-capped
#   row 1  4.0  1.8  1.9  2.2  0.9   geo 1.94 (drop)   4.0 token-masked; 4.0, 2.2 capped
#   row 2  0.2  0.9  1.0  x    x     geo 0.56 (drop)   0.2 token-masked
#   row 3  0.3  1.1  1.3  0.75 x=50  geo 0.75 (kept)   0.3 token-masked; the 50 is off the mask
#   row 4  no loss tokens (padding row)
STALE_RATIOS = np.array([[1.25, 0.9, 2.5, 1.1, 1.0], [4.0, 1.8, 1.9, 2.2, 0.9], [0.2, 0.9, 1.0, 1.0, 1.0],
                         [0.3, 1.1, 1.3, 0.75, 50.0], [1.0] * 5])
STALE_MASK = np.array([[1, 1, 1, 1, 0], [1] * 5, [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [0] * 5], bool)
STALE_ADV = np.array([1.0, -0.5, 2.0, -1.5, 0.0], np.float32)
TIS, TOK, SEQ = 2.0, 3.0, 1.5


def _stale_inputs():
    samp = np.random.default_rng(3).uniform(-3.0, -1.0, STALE_RATIOS.shape).astype(np.float32)
    lp = (samp + np.log(STALE_RATIOS)).astype(np.float32)
    return jnp.asarray(lp), jnp.asarray(samp), jnp.asarray(STALE_ADV), jnp.asarray(STALE_MASK)


def _np_stale(agg, tis=0.0, tok=0.0, seq=0.0):
    """numpy reference: (loss, d loss / d logprobs, kept tokens) of the corrected Dr.GRPO surrogate,
    with the aggregation's denominators of the unmasked batch."""
    m, r, a = STALE_MASK, STALE_RATIOS, STALE_ADV[:, None].astype(np.float64)
    keep = m.copy()
    if tok:
        keep &= (r >= 1 / tok) & (r <= tok)
    if seq:
        geo = np.exp(np.where(m, np.log(r), 0).sum(1) / np.maximum(m.sum(1), 1))
        keep &= ((geo >= 1 / seq) & (geo <= seq))[:, None]
    w = np.minimum(r, tis) if tis else r            # importance weight; value and gradient coefficient of A
    n = m.sum(1)
    if agg == "token_sum":
        coef = np.full(r.shape, 1.0 / len(r))
    elif agg == "seq_mean":
        coef = np.where(n > 0, 1.0 / np.maximum(n, 1), 0.0)[:, None] / (n > 0).sum() * np.ones(r.shape)
    else:
        coef = np.full(r.shape, 1.0 / m.sum())
    g = -np.where(keep, w * a * coef, 0.0)
    return float(g.sum()), g, keep


@pytest.mark.parametrize("agg", L.LOSS_AGGS)
@pytest.mark.parametrize("caps", [dict(tis=TIS), dict(tok=TOK), dict(seq=SEQ), dict(tis=TIS, tok=TOK, seq=SEQ)],
                         ids=["tis", "token_mask", "seq_mask", "all"])
def test_stale_corrections_match_numpy_reference(agg, caps):
    """Each correction (and all three) against the numpy reference: loss, per-token gradient and
    the stale/* metrics; masked tokens keep the aggregation's denominator."""
    lp, samp, adv, mask = _stale_inputs()
    kw = dict(tis_cap=caps.get("tis", 0.0), token_mask_cap=caps.get("tok", 0.0), seq_mask_cap=caps.get("seq", 0.0))
    (loss, met), g = jax.value_and_grad(
        lambda x: L.policy_gradient_loss(x, samp, adv, mask, L.LossConfig(agg=agg, **kw)), has_aux=True)(lp)
    want, want_g, keep = _np_stale(agg, **caps)
    np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(g), want_g, rtol=1e-5, atol=1e-6)
    ntok = STALE_MASK.sum()
    assert float(met["num_tokens"]) == ntok                       # the denominator's tokens: all 16
    np.testing.assert_allclose(float(met["stale/masked_token_fraction"]), (STALE_MASK & ~keep).sum() / ntok, atol=1e-7)
    clipped = (STALE_MASK & (STALE_RATIOS > TIS)).sum() / ntok if "tis" in caps else 0.0
    np.testing.assert_allclose(float(met["stale/tis_clipped_fraction"]), clipped, atol=1e-7)
    np.testing.assert_allclose(float(met["stale/mean_ratio"]), (STALE_RATIOS * STALE_MASK).sum() / ntok, rtol=1e-6)
    assert float(met["stale/mean_ratio"]) == float(met["ratio_mean"])


def test_stale_corrections_hand_values():
    """token_mean with all three caps, by hand: rows 1-2 dropped (geo means 1.94, 0.56), token 0.3
    of row 3 masked, 2.5 capped to 2: -(1.25 + 0.9 + 2 + 1.1 - 1.5 (1.1 + 1.3 + 0.75)) / 16."""
    lp, samp, adv, mask = _stale_inputs()
    loss, met = L.policy_gradient_loss(lp, samp, adv, mask, L.LossConfig(agg="token_mean", tis_cap=TIS,
                                                                         token_mask_cap=TOK, seq_mask_cap=SEQ))
    assert abs(float(loss) - (-(5.25 - 1.5 * 3.15) / 16)) < 1e-6
    assert float(met["stale/masked_token_fraction"]) == 9 / 16       # 5 + 3 dropped rows, 1 masked token
    assert float(met["stale/tis_clipped_fraction"]) == 3 / 16        # 2.5, 4.0, 2.2
    np.testing.assert_array_equal(np.asarray(L.sequence_ratio_mask(lp - samp, mask, SEQ)),
                                  [True, False, False, True, True])
    np.testing.assert_array_equal(np.asarray(L.token_ratio_mask(lp - samp, TOK))[:4, 0], [True, False, False, False])


def test_tis_weight_is_detached():
    """The TIS gradient is the plain on-policy PG gradient (A ∇log q) times w = min(r, c) — the
    weight replaces r, no gradient flows through it — and with the PPO clip a clip-bound token
    keeps its zero gradient while the others are weighted by w."""
    lp, samp, adv, mask = _stale_inputs()
    w = np.minimum(STALE_RATIOS, TIS)
    g_tis = jax.grad(lambda x: L.policy_gradient_loss(x, samp, adv, mask, L.LossConfig(tis_cap=TIS))[0])(lp)
    g_plain = jax.grad(lambda x: L.policy_gradient_loss(x, jax.lax.stop_gradient(x), adv, mask)[0])(lp)
    assert np.abs(np.asarray(g_plain)).max() > 0
    np.testing.assert_allclose(np.asarray(g_tis), w * np.asarray(g_plain), rtol=1e-6, atol=1e-7)
    wj, capped = L.tis_weight(lp - samp, TIS)
    np.testing.assert_allclose(np.asarray(wj), w, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(capped), STALE_RATIOS > TIS)
    assert np.all(np.asarray(jax.grad(lambda x: L.tis_weight(x, TIS)[0].sum())(lp - samp)) == 0)
    a = STALE_ADV[:, None]
    binds = ((a > 0) & (STALE_RATIOS > 1.2)) | ((a < 0) & (STALE_RATIOS < 0.8))
    g_clip = jax.grad(
        lambda x: L.policy_gradient_loss(x, samp, adv, mask, L.LossConfig(tis_cap=TIS, clip_eps=0.2))[0])(lp)
    np.testing.assert_allclose(np.asarray(g_clip), np.where(binds, 0.0, w * np.asarray(g_plain)), rtol=1e-6, atol=1e-7)


def test_stale_masks_leave_the_kl_term_alone_and_stay_finite():
    """Masks drop the policy-gradient surrogate only: the "loss"-mode KL term, its gradient and the
    kl_* metrics are unchanged. A masked token whose ratio overflows exp gives a finite gradient."""
    lp, samp, adv, mask = _stale_inputs()
    ref = lp - 0.3
    kl = dict(kl_coef=0.5, kl_mode="loss")
    caps = dict(token_mask_cap=TOK, seq_mask_cap=SEQ)

    def vg(ref=None, **kw):
        return jax.value_and_grad(
            lambda x: L.policy_gradient_loss(x, samp, adv, mask, L.LossConfig(**kw), ref_logprobs=ref),
            has_aux=True)(lp)

    (_, m_on), g_on = vg(ref, **kl, **caps)
    (_, m_off), g_off = vg(ref, **kl)
    (_, _), g_pg_on = vg(**caps)
    (_, _), g_pg_off = vg()
    for k in ("kl_loss", "kl_k1", "kl_k2", "kl_k3"):
        assert float(m_on[k]) == float(m_off[k]), k
    assert float(m_on["pg_loss"]) != float(m_off["pg_loss"])
    np.testing.assert_allclose(np.asarray(g_on - g_off), np.asarray(g_pg_on - g_pg_off), atol=1e-7)
    huge = samp.at[2, 0].set(-200.0)                                  # r = e^~198 at a masked token
    g = jax.grad(lambda x: L.policy_gradient_loss(x, huge, adv, mask, L.LossConfig(token_mask_cap=TOK))[0])(lp)
    assert np.all(np.isfinite(np.asarray(g))) and float(g[2, 0]) == 0.0


@pytest.mark.parametrize("agg,clip,mode", [("token_sum", None, "reward"), ("seq_mean", 0.2, "reward_token"),
                                           ("token_mean", 0.2, "loss")])
def test_stale_caps_off_or_not_binding_are_bit_identical(agg, clip, mode):
    """Default (off) = explicit 0 / None = caps that bind nowhere: the same loss, gradient and
    metrics bit for bit (the default is the pre-issue-23 computation; the non-binding case shows
    the corrections add nothing but their masks and weights)."""
    lp, samp, adv, mask = _stale_inputs()
    samp = lp - 0.1 * jnp.tanh(samp)                 # ratios in (0.9, 1.1): no cap binds
    base = dict(agg=agg, clip_eps=clip, kl_mode=mode, kl_coef=0.3)

    def run(**kw):
        (loss, met), g = jax.value_and_grad(
            lambda x: L.policy_gradient_loss(x, samp, adv, mask, L.LossConfig(**base, **kw), ref_logprobs=lp - 0.2),
            has_aux=True)(lp)
        return np.asarray(loss), {k: np.asarray(v) for k, v in met.items()}, np.asarray(g)

    ref_loss, ref_met, ref_g = run()
    for kw in (dict(tis_cap=0.0, token_mask_cap=0.0, seq_mask_cap=0.0), dict(tis_cap=None, seq_mask_cap=None),
               dict(tis_cap=1e30, token_mask_cap=1e30, seq_mask_cap=1e30)):
        loss, met, g = run(**kw)
        np.testing.assert_array_equal(loss, ref_loss)
        np.testing.assert_array_equal(g, ref_g)
        assert met.keys() == ref_met.keys()
        for k in met:
            np.testing.assert_array_equal(met[k], ref_met[k], err_msg=k)
    assert ref_met["stale/masked_token_fraction"] == 0 and ref_met["stale/tis_clipped_fraction"] == 0
    cfg = load_config_file("configs/rl_tiny.py").rl
    lc = L.loss_config(cfg)
    assert {k: getattr(lc, k) for k in L.STALE_CAPS} == dict(tis_cap=0.0, token_mask_cap=0.0, seq_mask_cap=0.0)
    assert L.LossConfig(tis_cap=None, seq_mask_cap=None) == L.LossConfig()      # None = 0 = off


def test_stale_cap_validation():
    """A cap must be 0 (off) or > 1: the loss raises ValueError, the RL config check one ConfigError line."""
    from horizon.rl.runtime.checks import validate_rl
    from horizon.utils.config import ConfigError

    lp, samp, adv, mask = _stale_inputs()
    for name in L.STALE_CAPS:
        for bad in (0.5, 1.0, -2.0):
            with pytest.raises(ValueError, match=name):
                L.LossConfig(**{name: bad})
    c = load_config_file("configs/rl_tiny.py")
    steps = int(c.exp.steps)
    validate_rl(c, steps)                                      # defaults (0) pass
    for name in L.STALE_CAPS:
        for bad, why in ((0.5, "must be 0 (off) or > 1"), (1.0, "must be 0 (off) or > 1"), (-1.0, "must be in")):
            c2 = load_config_file("configs/rl_tiny.py")
            c2.rl.stale[name] = bad
            with pytest.raises(ConfigError) as e:
                validate_rl(c2, steps)
            msg = str(e.value)
            assert "\n" not in msg and msg.startswith(f"rl.stale.{name}={bad!r}: ") and why in msg, msg
        c.rl.stale[name] = 2.0
    validate_rl(c, steps)                                      # caps > 1 pass
