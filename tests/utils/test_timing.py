"""horizon.utils.timing: what is called, with which inputs, and what is returned (never how fast)."""

import jax.numpy as jnp
import pytest

from horizon.utils.timing import best_seconds, timed


def test_timed_builds_inputs_outside_and_counts_calls():
    seen = []
    out, ts = timed(lambda x: seen.append(x) or x * 2, warmup=2, reps=3, make_input=lambda r: r)
    assert seen == [10_000, 10_001, 0, 1, 2] and out == 4        # warm-up inputs differ from timed ones
    assert len(ts) == 3 and all(t >= 0 for t in ts)
    out, ts = timed(lambda: "x", warmup=0, reps=1)
    assert out == "x" and len(ts) == 1
    with pytest.raises(ValueError, match="reps"):
        timed(lambda: None, warmup=0, reps=0)


def test_best_seconds_alternates_argument_sets():
    calls = []

    def f(a):
        calls.append(int(a[0]))
        return a + 1

    t = best_seconds(f, [(jnp.zeros(2),), (jnp.ones(2),)], reps=3)
    assert calls == [0, 1, 0, 1, 0] and t >= 0                      # one warm call per set, then alternating
    with pytest.raises(ValueError, match="no argument sets"):
        best_seconds(f, [], reps=1)
