"""`moe.expert_order`: the counting sort equals the stable argsort it replaces, bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from horizon.model import moe


@pytest.mark.parametrize("n,experts", [(300, 8), (4096, 8), (1000, 33), (64, 8)])
def test_expert_order_is_the_stable_argsort(n, experts, monkeypatch):
    """Inside and outside the counting range (64 x 8 is below it on CPU; the range forced open too):
    the order equals numpy's stable argsort, ties in their original order."""
    ids = np.random.default_rng(n).integers(0, experts, n).astype(np.int32)
    ids[: n // 4] = experts - 1                     # a large tie block: stability matters
    want = np.argsort(ids, kind="stable")
    for rng in (moe.COUNTING_SORT.get(jax.default_backend(), (1, 0)), (1, 1 << 30)):
        monkeypatch.setitem(moe.COUNTING_SORT, jax.default_backend(), rng)
        got = np.asarray(jax.jit(lambda x: moe.expert_order(x, experts))(jnp.asarray(ids)))
        np.testing.assert_array_equal(got, want)


def test_expert_order_uses_the_counting_sort_in_its_range(monkeypatch):
    """The range picks the schedule: no sort op in the compiled computation inside it, one outside."""
    ids = jnp.zeros(512, jnp.int32)
    monkeypatch.setitem(moe.COUNTING_SORT, jax.default_backend(), (256, 1 << 19))
    inside = jax.jit(lambda x: moe.expert_order(x, 8)).lower(ids).as_text()      # fresh functions: no
    monkeypatch.setitem(moe.COUNTING_SORT, jax.default_backend(), (1, 0))          # trace-cache reuse
    outside = jax.jit(lambda x: moe.expert_order(x, 8)).lower(ids).as_text()
    assert "stablehlo.sort" not in inside and "stablehlo.sort" in outside
