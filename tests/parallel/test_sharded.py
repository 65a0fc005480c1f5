"""Sharded LM train step == single-device step on every 8-device preset (docs/SPEC.md §2).

Covers the zigzag CP layout (fsdp4xcp2, ep4xcp2) and the EP all-to-all (ep4xcp2, ep8). One compile
per preset (module fixture for the reference). The default run keeps fsdp4xcp2 (zigzag CP + FSDP) and
ep4xcp2 (zigzag CP + EP all-to-all); dp8 and ep8 are `slow` (dp8 is the plain GSPMD path, also run by
default in test_sharded_sampler.py; ep8 is the same EP dispatch with 8-way groups)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from horizon.parallel import mesh as pmesh
from horizon.train import lm
from tests.parallel.conftest import mesh_cfg

PRESETS = [pytest.param("dp8", marks=pytest.mark.slow), "fsdp4xcp2", "ep4xcp2",
           pytest.param("ep8", marks=pytest.mark.slow)]


@pytest.fixture(scope="module")
def reference(batch):
    cfg = mesh_cfg("")
    state = lm.init_state(jax.random.key(0), cfg)
    state = state._replace(step=jnp.asarray(10, jnp.int32))  # past warmup start: lr > 0
    new_state, metrics = lm.jit_train_step(cfg)(state, batch)
    return state, new_state, metrics


def _first_moments(state):
    """Adam's first moment after ONE step from zero state is (1 - b1) * clipped grad, elementwise: the
    gradient check without compiling a second function."""
    mus = [s.mu for s in jax.tree.leaves(state.opt_state, is_leaf=lambda s: hasattr(s, "mu")) if hasattr(s, "mu")]
    assert len(mus) == 1
    return mus[0]


def _assert_tree_close(a, b, rtol, what):
    for (path, u), v in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
        u, v = np.asarray(u, np.float64), np.asarray(v, np.float64)
        # f32 with "highest" matmul precision: only reduction order differs between layouts; the
        # atol (1e-6 of the leaf's scale) covers entries that are ~0 by cancellation
        np.testing.assert_allclose(u, v, rtol=rtol, atol=1e-6 * (np.abs(v).max() + 1e-30),
                                   err_msg=f"{what} {jax.tree_util.keystr(path)}")


@pytest.mark.parametrize("preset", PRESETS)
def test_sharded_lm_step_equals_single_device(preset, reference, batch, need8):
    state, ref_state, ref_m = reference
    cfg = mesh_cfg(preset)
    mesh = pmesh.make_mesh(cfg.mesh)
    step, st_sh, b_sh = lm.make_train_step(cfg, mesh, jax.eval_shape(lambda: state))
    new_state, m = step(jax.device_put(state, st_sh), jax.device_put(batch, b_sh))
    np.testing.assert_allclose(float(m["loss"]), float(ref_m["loss"]), rtol=1e-5)
    np.testing.assert_allclose(float(m["grad_norm"]), float(ref_m["grad_norm"]), rtol=1e-5)
    assert float(m["tokens"]) == float(ref_m["tokens"])
    _assert_tree_close(_first_moments(new_state), _first_moments(ref_state), 1e-5, "grad (Adam mu)")
    _assert_tree_close(new_state.params, ref_state.params, 1e-5, "param")
    # the output state keeps the rules' shardings (FSDP / EP sharded, not gathered)
    for got, want in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(st_sh.params)):
        assert got.sharding.is_equivalent_to(want, got.ndim)
