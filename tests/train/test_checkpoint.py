"""Orbax checkpoint wrapper (docs/SPEC.md §8): bitwise round trip of the full TrainState, retention."""

import jax
import jax.numpy as jnp
import numpy as np

from horizon.train import checkpoint, lm


def test_roundtrip_and_retention(tmp_path, cfg):
    state = lm.init_state(jax.random.PRNGKey(0), cfg)
    ck = checkpoint.Checkpointer(tmp_path / "ck", every=2, keep=2)
    assert ck.restore_latest(state) is None
    assert not ck.should_save(0) and not ck.should_save(3) and ck.should_save(4)
    for step in (2, 4, 6):
        s = state._replace(step=jnp.asarray(step, jnp.int32),
                           params=jax.tree.map(lambda x, step=step: x + step, state.params))
        assert ck.save(step, s, {"data_step": step, "seed": 0})
    assert not ck.save(6, s, {"data_step": 6})  # already there: no double write
    assert ck.all_steps() == [4, 6]             # keep=2
    ck.close()

    # A fresh manager (as after a restart) finds the newest checkpoint.
    ck2 = checkpoint.Checkpointer(tmp_path / "ck", every=2, keep=2)
    restored, meta = ck2.restore_latest(state)
    assert meta == {"data_step": 6, "seed": 0}
    assert isinstance(restored, lm.TrainState) and int(restored.step) == 6
    assert jax.tree.structure(restored) == jax.tree.structure(s)
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(s)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # bitwise
    old, meta4 = ck2.restore(4, state)
    assert int(old.step) == 4 and meta4["data_step"] == 4
    ck2.close()
