"""Global sequence packing across DP ranks vs round-robin (docs/SPEC.md §2)."""

import numpy as np
import pytest

from horizon.parallel import packing as pk

COST = pk.CostModel(a=1.0, b=1.0 / 4096)  # attention's n^2 term equals the linear term at n = 4096


def _lognormal(n=512, seed=0):
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(2000), 1.0, n), 64, 32768).astype(int)


@pytest.mark.parametrize("method,equal_count", [("lpt", False), ("lpt", True), ("kk", False)])
def test_balanced_packing_on_heavy_tailed_rollouts(method, equal_count, capsys):
    lengths = _lognormal()
    base = pk.balance(lengths, 8, COST, method="round_robin")
    a = pk.balance(lengths, 8, COST, method=method, equal_count=equal_count)
    with capsys.disabled():
        print(f"\n  {base.summary()}\n  {a.summary()}  (equal_count={equal_count})")
    assert a.imbalance <= 1.05
    assert base.imbalance > 1.3  # the baseline really is unbalanced on this data
    assert sorted(i for r in a.ranks for i in r) == list(range(512))  # a partition
    np.testing.assert_allclose(a.loads.sum(), COST(lengths).sum())
    if equal_count:
        assert {len(r) for r in a.ranks} == {64}
        order = pk.rank_order(a)
        assert sorted(order) == list(range(512))


def test_pareto_tail_reaches_lower_bound():
    """Pareto(1.5): one rollout can cost more than a rank's mean; then max(item) is the optimum."""
    rng = np.random.default_rng(1)
    lengths = np.clip((rng.pareto(1.5, 512) + 1) * 500, 64, 32768).astype(int)
    c = COST(lengths)
    lower = max(c.max(), c.sum() / 8)
    a = pk.balance(lengths, 8, COST, method="lpt")
    base = pk.balance(lengths, 8, COST, method="round_robin")
    assert a.loads.max() <= 1.05 * lower
    assert base.loads.max() > 1.2 * a.loads.max()


def test_quadratic_term_matters():
    """Balancing by tokens only (b = 0) leaves the attention-heavy cost unbalanced."""
    lengths = _lognormal(seed=2)
    by_tokens = pk.balance(lengths, 8, pk.CostModel(1.0, 0.0), method="lpt")
    true_loads = np.array([COST(lengths[r]).sum() for r in by_tokens.ranks])
    with_model = pk.balance(lengths, 8, COST, method="lpt")
    assert with_model.imbalance <= 1.05 < true_loads.max() / true_loads.mean()


def test_fit_cost_model_recovers_coefficients():
    rng = np.random.default_rng(3)
    steps = [rng.integers(64, 8192, size=rng.integers(4, 32)) for _ in range(40)]
    a, b, c0 = 2e-6, 3e-10, 0.05
    times = [c0 + a * s.sum() + b * (s.astype(float) ** 2).sum() for s in steps]
    times = np.array(times) * (1 + 0.01 * rng.standard_normal(len(times)))  # 1% timing noise
    m = pk.fit_cost_model(steps, times)
    assert abs(m.a - a) / a < 0.1 and abs(m.b - b) / b < 0.1
    # no quadratic signal -> b clipped at 0, a refitted
    m0 = pk.fit_cost_model(steps, [a * s.sum() for s in steps], intercept=False)
    assert m0.b == pytest.approx(0.0, abs=1e-15) and m0.a == pytest.approx(a, rel=1e-6)


def test_bad_inputs():
    with pytest.raises(ValueError, match="method"):
        pk.balance([1, 2], 2, method="random")
    with pytest.raises(ValueError, match="divisible"):
        pk.balance([1, 2, 3], 2, equal_count=True)
    with pytest.raises(ValueError, match="different row counts"):
        pk.rank_order(pk.balance([100, 1, 1], 2, method="lpt"))
