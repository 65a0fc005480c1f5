"""pass@k estimator, summaries and behaviour metrics on constructed records (docs/SPEC.md §7)."""

import itertools
import math

import pytest

from horizon.agent import STATS_KEYS
from horizon.eval import behaviour_metrics, inference_flops, pass_at_k, summarize


@pytest.mark.parametrize("n,c,k,want", [
    (5, 0, 1, 0.0), (5, 5, 3, 1.0), (5, 1, 1, 0.2),
    (5, 2, 2, 1 - 3 / 10),          # 1 - C(3,2)/C(5,2)
    (10, 3, 5, 1 - 21 / 252),       # 1 - C(7,5)/C(10,5)
    (4, 1, 4, 1.0), (4, 2, 3, 1.0),  # n - c < k: some success always among k
])
def test_pass_at_k_hand_values(n, c, k, want):
    assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)   # exact rationals; float error ~1e-16


def test_pass_at_k_equals_subset_enumeration():
    """Definition: fraction of k-subsets of the n samples that contain a success."""
    for n in range(1, 7):
        for c in range(n + 1):
            samples = [1] * c + [0] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(samples, k))
                want = sum(any(s) for s in subsets) / len(subsets)
                assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("n,c,k", [(0, 0, 1), (3, 4, 1), (3, 1, 0), (3, 1, 4), (3, -1, 1)])
def test_pass_at_k_rejects_bad_input(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def _rec(task, p, reward, **stats):
    r = dict(policy="p", task_id=task, kind="config", should_edit=True, pass_index=p, reward=reward,
             solved=reward >= 1.0, completion_tokens=100 * (p + 1), latency_s=1.0, gen_flops=0.0, flops=2.0,
             eager_edit=None, **{k: 0 for k in STATS_KEYS})
    r.update(stats)
    return r


def test_summarize_mean_and_best_of_k():
    recs = [_rec("a", 0, 1.0), _rec("a", 1, 0.0), _rec("a", 2, 0.0),     # a: 1 of 3
            _rec("b", 0, 0.0), _rec("b", 1, 0.0), _rec("b", 2, 0.0),     # b: 0 of 3
            _rec("c", 0, 1.0), _rec("c", 1, 1.0), _rec("c", 2, 0.5)]     # c: 2 of 3 solved, partial 0.5
    rows, o = summarize(recs)
    by = {r["task_id"]: r for r in rows}
    assert by["a"]["accuracy"] == pytest.approx(1 / 3) and by["a"]["best_of_1"] == pytest.approx(1 / 3)
    assert by["a"]["best_of_2"] == pytest.approx(2 / 3) and by["a"]["best_of_3"] == 1.0
    assert by["c"]["accuracy"] == pytest.approx(2.5 / 3) and by["c"]["best_of_2"] == 1.0
    assert by["b"]["best_of_3"] == 0.0
    assert o["accuracy"] == pytest.approx((1 / 3 + 0 + 2.5 / 3) / 3)
    assert o["best_of_3"] == pytest.approx(2 / 3)
    assert o["best_of_1"] <= o["best_of_2"] <= o["best_of_3"]
    assert o["completion_tokens"] == pytest.approx(200.0)     # mean of 100, 200, 300 per task
    assert o["total_flops"] == pytest.approx(18.0)


def test_summarize_rejects_ragged_passes():
    with pytest.raises(ValueError):
        summarize([_rec("a", 0, 1.0), _rec("a", 1, 1.0), _rec("b", 0, 1.0)], num_passes=2)


def test_behaviour_metrics_on_constructed_records():
    recs = [_rec("q", 0, 0.0, turns=4, malformed_calls=2, todos_created=3, todos_completed=1),
            _rec("q", 1, 1.0, turns=4, malformed_calls=0, todos_created=2, todos_completed=2),
            _rec("e", 0, 1.0, turns=2, malformed_calls=0)]
    recs[0]["eager_edit"], recs[1]["eager_edit"] = True, False       # q is a should_edit=False task
    m = behaviour_metrics(recs)
    assert m["malformed_call_rate"] == pytest.approx(2 / 10)
    assert m["episodes_with_malformed"] == pytest.approx(1 / 3)
    assert m["eager_edit_rate"] == pytest.approx(0.5) and m["no_edit_episodes"] == 2
    assert m["todo_completion_rate"] == pytest.approx(3 / 5)
    assert m["unfinished_todo_episodes"] == pytest.approx(0.5)
    none = behaviour_metrics([_rec("e", 0, 1.0, turns=1)])
    assert math.isnan(none["eager_edit_rate"]) and math.isnan(none["todo_completion_rate"])
    with pytest.raises(KeyError):
        behaviour_metrics([{"turns": 1}])


def test_inference_flops():
    assert inference_flops(1_000, 10) == 20_000.0


def test_reward_curve_helpers():
    """experiments/rl_async.py's curve comparisons: trailing mean, first time a target is reached."""
    import numpy as np

    from horizon.eval.report import reward_at, smooth, time_to_reach

    np.testing.assert_allclose(smooth([1, 2, 3, 4], 2), [1.0, 1.5, 2.5, 3.5])
    assert time_to_reach([0, 1, 2, 3], [0, 1, 2, 3], 2.5, 2) == 3.0
    assert time_to_reach([0, 1], [0, 0], 1.0, 1) is None
    assert reward_at([0, 1, 2, 3], [0, 1, 2, 3], 1.5, 2) == 0.5 and reward_at([1, 2], [0, 1], 0.5, 1) is None
