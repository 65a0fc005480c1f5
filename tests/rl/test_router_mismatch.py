"""A sampler whose numerics differ from the trainer's (docs/SPEC.md §4.1): bf16 compute and router-logit
noise in the sampler give the trainer a measurable log-prob and routing mismatch; router replay makes the
trainer route as the sampler did; the plausibility filter's gate-score mode."""

import functools
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from horizon.data.tokenizer import ByteTokenizer
from horizon.inference import sampler
from horizon.inference.config import validate_numerics
from horizon.model import moe
from horizon.model.params import numpy_init
from horizon.rl.algo import mismatch, routing, trainer
from horizon.utils.config import ConfigError, load_config_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOK = ByteTokenizer()
NEW = 12


def _cfg(**sampler_fields) -> ml_collections.FrozenConfigDict:
    c = load_config_file(ROOT / "configs" / "rl_tiny.py")
    c.rl.sampler.update(sampler_fields)
    c.rl.sampler.update(dict(min_batch_bucket=4, min_prompt_bucket=16, min_new_bucket=16))
    c.rl.batch.update(dict(min_rows=4, min_seq=32))
    return ml_collections.FrozenConfigDict(c)


def _batch(cfg, params, prompts, key) -> dict:
    out = sampler.generate(params, prompts, key, cfg=cfg, max_new_tokens=NEW, sampling=sampler.sampler_config(cfg))
    return mismatch.sampled_batch(prompts, out, cfg, rewards=[1.0, 0.0, 1.0, 0.0])


@pytest.fixture(scope="module")
def runs():
    """The same prompts and key sampled by a matched sampler and by a bf16 one with router noise."""
    matched = _cfg()
    params = numpy_init(matched.model, 0)
    rng = np.random.default_rng(0)
    prompts = [np.r_[TOK.BOS, rng.integers(97, 123, 10)].astype(np.int32) for _ in range(4)]
    key = jax.random.key(3)
    mismatched = _cfg(compute_dtype="bfloat16", router_noise=1.0)
    return dict(params=params, matched=(matched, _batch(matched, params, prompts, key)),
                mismatched=(mismatched, _batch(mismatched, params, prompts, key)))


def test_sampler_numerics_apply_to_the_sampler_only():
    c = _cfg(compute_dtype="bfloat16", router_noise=0.5)
    m = sampler.frozen_model_cfg(c)
    assert (m.dtype, m.router_logit_noise) == ("bfloat16", 0.5)
    assert (c.model.dtype, c.model.router_logit_noise) == ("float32", 0.0)       # the trainer's model
    assert trainer.step_config(c).model.dtype == "float32"     # a refreeze of the model section too
    assert sampler.frozen_model_cfg(_cfg()).dtype == "float32"
    assert sampler.sampler_numerics(c.model) == {}


@pytest.mark.parametrize("field,value", [("compute_dtype", "fp8"), ("router_noise", -0.1)])
def test_bad_sampler_numerics_are_one_line_errors(field, value):
    s = ml_collections.ConfigDict({field: value})
    with pytest.raises(ConfigError, match=f"rl.sampler.{field}"):
        validate_numerics(s)


def test_a_matched_sampler_has_no_mismatch(runs):
    cfg, b = runs["matched"]
    r = mismatch.report(runs["params"], b, cfg=cfg)
    # same f32 programs up to XLA fusion: make run logs a max gap of ~2.5e-8 (docs/PERF.md)
    assert r["tokens"] == 4 * NEW and r["logprob_gap_max"] < 1e-5
    assert r["routing_own"] == 0.0 and r["routing_trained"] == 0.0


def test_a_mismatched_sampler_shows_in_the_train_step_and_replay_removes_its_routing(runs):
    cfg, b = runs["mismatched"]
    matched = mismatch.report(runs["params"], runs["matched"][1], cfg=cfg)
    r = mismatch.report(runs["params"], b, cfg=cfg)
    # router noise of std 1 on logits of std ~0.02 x |x| reroutes most tokens in some layer
    assert r["routing_own"] > 0.2, r
    assert r["routing_trained"] == 0.0, r                 # replay: the trainer routes as the sampler did
    assert r["logprob_gap_mean"] > 100 * max(matched["logprob_gap_mean"], 1e-9), (r, matched)
    assert r["logprob_gap_p99"] > r["logprob_gap_p50"] > 0, r
    state = trainer.init_state(jax.tree.map(jnp.copy, runs["params"]), cfg)
    _, m = trainer.train_step(state, b, cfg=cfg)
    np.testing.assert_allclose(float(m["sampler_logprob_diff"]), r["logprob_gap_mean"], rtol=1e-4)
    np.testing.assert_allclose(float(m["sampler_logprob_diff_max"]), r["logprob_gap_max"], rtol=1e-4)
    np.testing.assert_allclose(float(m["routing/own_vs_sampler"]), r["routing_own"], rtol=1e-6)
    assert float(m["routing/trained_vs_sampler"]) == 0.0


def test_without_replay_the_trainer_trains_with_its_own_routing(runs):
    cfg, b = runs["mismatched"]
    off = ml_collections.ConfigDict(cfg.to_dict())
    off.rl.router_replay = False
    off = ml_collections.FrozenConfigDict(off)
    r_on = mismatch.report(runs["params"], b, cfg=cfg)
    r_off = mismatch.report(runs["params"], b, cfg=off)
    assert r_off["routing_trained"] == r_off["routing_own"] == r_on["routing_own"] > 0
    assert r_off["logprob_gap_mean"] > r_on["logprob_gap_mean"], (r_off, r_on)


def test_disagreement_is_order_free_and_over_recorded_loss_tokens():
    rec = jnp.array([[[0, 1], [2, 3], [4, 5], [-1, -1]]], jnp.int32)          # 1 layer, 4 tokens
    own = jnp.array([[[1, 0], [2, 6], [4, 5], [0, 1]]], jnp.int32)
    mask = jnp.array([[True, True, False, True]])
    # token 0 same set (order differs), token 1 differs, token 2 not a loss token, token 3 unrecorded
    assert float(routing.disagreement(own, rec, mask)) == pytest.approx(0.5)


def test_gate_score_filter_ignores_the_balancing_bias():
    """An expert the balancer's bias favours passes the selection-score filter on its bias alone; the
    gate-score filter sees its low affinity and replaces it."""
    base = load_config_file(ROOT / "configs" / "tiny.py").model
    base.n_group = base.topk_group = 1
    base.replay_plausibility_ratio = 0.5
    E = base.num_experts
    x = jnp.eye(base.d_model)[:1]
    logits = jnp.array([[3.0, 2.0] + [-3.0] * (E - 2)])                       # s ~ [0.95, 0.88, 0.05, ...]
    router = jnp.zeros((base.d_model, E)).at[0].set(logits[0])
    bias = jnp.zeros(E).at[2].set(2.0)                                        # u_2 ~ 2.05: plausible by u
    p = {"router": router, "router_bias": bias}
    replay = jnp.array([[0, 2]], jnp.int32)
    idx = {}
    for score in moe.PLAUSIBILITY_SCORES:
        c = ml_collections.ConfigDict(base.to_dict())
        c.replay_plausibility_score = score
        idx[score] = np.asarray(jax.jit(functools.partial(moe.route, cfg=ml_collections.FrozenConfigDict(c)))(
            p, x, replay_indices=replay)[1])
    np.testing.assert_array_equal(idx["selection"], [[0, 2]])
    np.testing.assert_array_equal(idx["gate"], [[0, 1]])


def test_router_noise_has_the_asked_scale():
    x = jax.random.normal(jax.random.key(0), (4096, 32)) * 50.0
    n = np.asarray(moe.router_noise(x, 8, 0.3))
    assert n.std() == pytest.approx(0.3, rel=0.05)                            # 32k isotropic draws: ~0.4% std error
    np.testing.assert_array_equal(n, np.asarray(moe.router_noise(x, 8, 0.3)))  # deterministic in x


def test_policy_divergence_scores_the_sampled_tokens_only(load_script):
    """benchmarks/policy_divergence.py: KL(reference || run) at the positions that predict sampled tokens
    (position t's distribution is over token t + 1), zero where the two distributions agree."""
    bench = load_script("benchmarks/policy_divergence.py")
    out = type("Out", (), {"tokens": [np.array([7, 8], np.int32), np.array([9], np.int32)]})()
    tokens, mask = bench.padded([np.array([1, 2], np.int32), np.array([3, 4, 5], np.int32)], out, pad=0)
    assert tokens.tolist() == [[1, 2, 7, 8], [3, 4, 5, 9]]
    assert mask.tolist() == [[False, False, True, True], [False, False, False, True]]
    rng = np.random.default_rng(0)
    ref = np.asarray(jax.nn.log_softmax(rng.normal(size=(2, 4, 5))), np.float64)
    other = ref.copy()
    other[0, 1] = np.asarray(jax.nn.log_softmax(rng.normal(size=5)))     # predicts row 0's first sample
    other[1, 3] = np.asarray(jax.nn.log_softmax(rng.normal(size=5)))     # predicts past the row: never scored
    kl = bench.token_kl(ref, other, mask)
    want = float(np.sum(np.exp(ref[0, 1]) * (ref[0, 1] - other[0, 1])))
    assert kl.shape == (3,) and kl[0] == pytest.approx(want, rel=1e-12) and want > 0
    assert np.all(kl[1:] == 0.0)
