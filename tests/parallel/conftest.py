"""Shared fixtures for the parallelism tests (8 fake CPU devices from tests/conftest.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from horizon.model import transformer
from horizon.utils.config import load_config_file

B, S = 8, 32  # tiny: 8 rows so every preset splits the batch; S divisible by 2*CP = 4


def mesh_cfg(preset: str):
    cfg = load_config_file("configs/tiny.py")
    cfg.mesh.preset = preset
    cfg.model.num_layers = 2  # one dense + one MoE layer: compile time dominates on CPU
    return cfg


def make_batch(seed: int = 0, b: int = B, s: int = S, vocab: int = 320) -> dict:
    """Packed rows: 3 segments of unequal length (one crossing the zigzag chunk boundaries), a padded
    tail (segment 3, mask 0) — exercises segment isolation under the permuted layout."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (b, s)).astype(np.int32)
    cuts = [0, 11, 23, 29, s]
    seg = np.zeros((b, s), np.int32)
    for i in range(4):
        seg[:, cuts[i]:cuts[i + 1]] = i
    pos = np.asarray(transformer.default_positions(jnp.asarray(tokens), jnp.asarray(seg)))
    mask = (seg < 3).astype(np.float32)
    return dict(tokens=tokens, segment_ids=seg, positions=pos.astype(np.int32), mask=mask)


@pytest.fixture(scope="session")
def batch():
    return make_batch()


@pytest.fixture(scope="session")
def need8():
    if len(jax.devices()) < 8:
        pytest.skip(f"needs 8 devices, have {len(jax.devices())} (XLA_FLAGS set too late?)")


def assert_adam_params_close(got, want, *, rtol: float, lr: float, label: str = "") -> None:
    """Params after a few Adam steps on two layouts of the same computation (a mesh vs one device).

    Adam moves a weight by ~``lr * g / (|g| + eps)`` whatever the gradient's size, so where a gradient
    entry is itself roundoff-sized (|g| ~ eps) the layouts' reassociated sums move it by different
    fractions of lr. Hence: every element within `rtol` (+ 1e-3 * lr), except at most 0.1% of a
    tensor's elements, which must still be within 0.05 * lr (a roundoff-sized gradient, not a bug:
    a wrong gradient moves weights by ~lr)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    d = np.abs(got - want)
    loose = d > rtol * np.abs(want) + 1e-3 * lr
    assert loose.mean() <= 1e-3, f"{label}: {loose.sum()} / {loose.size} elements beyond rtol={rtol}"
    assert d.max() <= 0.05 * lr, f"{label}: max |diff| {d.max():.3g} > 0.05 * lr ({0.05 * lr:.3g})"
