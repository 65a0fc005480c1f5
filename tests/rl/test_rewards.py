"""Tests for horizon.env.rewards (docs/SPEC.md §4): length-penalty curve family, effort, hooks."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from horizon.env import rewards as R
from horizon.utils.config import load_config_file


@pytest.fixture(scope="module")
def rl_cfg():
    r = load_config_file("configs/rl_tiny.py").rl
    r.length_penalty.enabled = True      # make run's task turns it off (one fixed-format call); the curve is on here
    return r


def _stats(**kw):
    s = {k: 0 for k in R.STATS_KEYS}
    s.update(kw)
    return s


KS = [1e-4, 1e-3, 1e-2, 0.1, 1.0]
QS = [0.0, 0.25, 0.5, 0.9, 0.999, 1.0, 1.5, 3.0]


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("q", QS)
def test_curve_increasing_and_concave(k, q):
    x = np.linspace(0.0, 50.0 / k, 2001)  # spans the bend at x ~ 1/k
    f = np.asarray(R.penalty_curve(jnp.asarray(x), k, q), np.float64)
    h = x[1] - x[0]
    assert f[0] == 0.0
    d1 = np.diff(f)
    assert np.all(d1 > 0), "not strictly increasing"
    d2 = np.diff(f, 2)
    # f is computed in f32: each value carries up to ~2 ulp (x cast, log1p, expm1), so a
    # second difference (|1|+|2|+|1| = 4 values) may be off by 8 ulp = 8·eps32·|f|.
    noise = 8 * np.finfo(np.float32).eps * np.abs(f[2:]) + 1e-12
    assert np.all(d2 <= noise), f"not concave: max second difference {d2.max()}"
    if q > 0:  # strictly concave: slope at the end well below the slope at 0 (which is 1)
        assert d1[-1] / h < 0.9 * d1[0] / h
    # Closed form of the slope f'(x) = (1 + kx)^(-q) (autodiff). rtol 2e-4: XLA:CPU f32
    # exp/log1p at arguments up to ~20 in magnitude were measured ~6e-5 off.
    xs = x[:: len(x) // 20]
    slope = jax.vmap(jax.grad(lambda v: R.penalty_curve(v, k, q)))(jnp.asarray(xs, jnp.float32))
    np.testing.assert_allclose(slope, (1 + k * xs) ** (-q), rtol=2e-4)


def test_curve_hand_values_and_limits():
    # k = 1, q = 0.5: f(3) = (sqrt(4) - 1) / 0.5 = 2
    assert abs(float(R.penalty_curve(3.0, 1.0, 0.5)) - 2.0) < 1e-6
    # q = 1: log(1 + kx)/k; q -> 1 is continuous.
    assert abs(float(R.penalty_curve(3.0, 1.0, 1.0)) - math.log(4.0)) < 1e-6
    assert abs(float(R.penalty_curve(3.0, 1.0, 1.0 - 1e-4)) - math.log(4.0)) < 1e-3
    # q = 0 is linear; q = 2 saturates at 1/(k(q-1)).
    assert abs(float(R.penalty_curve(7.0, 0.5, 0.0)) - 7.0) < 1e-5
    assert abs(float(R.penalty_curve(1e9, 0.5, 2.0)) - 2.0) < 1e-5
    # Negative effort is clamped to 0.
    assert float(R.penalty_curve(-5.0, 1.0, 0.5)) == 0.0


@pytest.mark.parametrize("k,q", [(0.0, 0.5), (-1.0, 0.5), (1.0, -0.1), (float("nan"), 0.5), (1.0, float("inf"))])
def test_curve_rejects_bad_params(k, q):
    with pytest.raises(ValueError, match="length penalty"):
        R.penalty_curve(1.0, k, q)


def test_effort_and_length_penalty(rl_cfg):
    lp = rl_cfg.length_penalty
    w = lp.weights
    st = _stats(thinking_tokens=100, tool_call_tokens=20, tool_output_tokens=400, final_tokens=30,
                tool_calls=3, turns=4)
    x = (w.thinking * 100 + w.tool_call * 20 + w.tool_output * 400 + w.final * 30
         + w.tool_calls * 3 + w.turns * 4)
    assert abs(float(R.effort(st, lp)) - x) < 1e-3
    want = lp.scale * ((1 + lp.k * x) ** (1 - lp.q) - 1) / (lp.k * (1 - lp.q))
    assert abs(R.length_penalty(st, lp) - want) < 1e-7
    assert R.length_penalty(_stats(), lp) == 0.0
    # More effort -> larger penalty; each extra tool call costs less on a long task.
    def pen(calls):
        return R.length_penalty(_stats(tool_calls=calls), lp)
    assert pen(2) - pen(1) > pen(201) - pen(200) > 0
    # Vectorised version agrees with the scalar one.
    many = [_stats(thinking_tokens=t, tool_calls=c, turns=c + 1) for t, c in [(0, 0), (500, 2), (9000, 40)]]
    batch = {k: jnp.array([m[k] for m in many]) for k in R.STATS_KEYS}
    np.testing.assert_allclose(R.length_penalty_batch(batch, lp), [R.length_penalty(m, lp) for m in many],
                               rtol=1e-6)


def test_length_penalty_config_errors(rl_cfg):
    lp = ml_collections.ConfigDict(rl_cfg.length_penalty.to_dict())
    with pytest.raises(KeyError, match="stats lack"):
        R.length_penalty({"thinking_tokens": 3}, lp)
    lp.weights.turns = -1.0
    with pytest.raises(ValueError, match="weights must be >= 0"):
        R.length_penalty(_stats(), lp)
    lp = ml_collections.ConfigDict(rl_cfg.length_penalty.to_dict())
    del lp.weights["final"]
    with pytest.raises(ValueError, match="lacks"):
        R.length_penalty(_stats(), lp)
    lp = ml_collections.ConfigDict(rl_cfg.length_penalty.to_dict())
    lp.enabled = False
    assert R.length_penalty(_stats(thinking_tokens=1000), lp) == 0.0


def test_behaviour_hooks():
    assert R.unfinished_todos_penalty(_stats(todos_created=5, todos_completed=2)) == -3.0
    assert R.unfinished_todos_penalty(_stats(todos_created=2, todos_completed=2)) == 0.0
    assert R.unfinished_todos_penalty(_stats(todos_created=1, todos_completed=3)) == 0.0
    assert R.malformed_calls_penalty(_stats(malformed_calls=4)) == -4.0
    with pytest.raises(ValueError):
        R.unfinished_todos_penalty(_stats(todos_created=-1))
    assert set(R.BEHAVIOUR_HOOKS) >= {"unfinished_todos", "malformed_calls"}
    with pytest.raises(ValueError, match="already registered"):
        R.register_behaviour_hook("unfinished_todos", lambda s: 0.0)


def test_total_reward_breakdown(rl_cfg):
    st = _stats(thinking_tokens=2000, tool_calls=5, turns=6, todos_created=3, todos_completed=1,
                malformed_calls=2)
    total, bd = R.total_reward(1.0, st, rl_cfg)
    lp = R.length_penalty(st, rl_cfg.length_penalty)
    b = rl_cfg.behaviour
    want = 1.0 - lp - 2 * b.unfinished_todos - 2 * b.malformed_calls
    assert abs(total - want) < 1e-9
    assert bd["total"] == total and bd["task"] == 1.0 and bd["length_penalty"] == lp > 0
    assert abs(bd["behaviour/unfinished_todos"] + 2 * b.unfinished_todos) < 1e-12
    # A custom hook plugs in through the registry and the config.
    name = "test_style_bonus"
    R.register_behaviour_hook(name, lambda s: 1.0 if s["final_tokens"] < 100 else 0.0)
    try:
        cfg = ml_collections.ConfigDict(rl_cfg.to_dict())
        cfg.behaviour[name] = 0.5
        total2, bd2 = R.total_reward(1.0, st, cfg)
        assert abs(total2 - (total + 0.5)) < 1e-9 and bd2[f"behaviour/{name}"] == 0.5
        cfg.behaviour["nope"] = 1.0
        with pytest.raises(ValueError, match="unknown hooks"):
            R.total_reward(1.0, st, cfg)
    finally:
        del R.BEHAVIOUR_HOOKS[name]
