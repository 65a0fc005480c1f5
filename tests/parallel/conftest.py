"""Shared fixtures for the parallelism tests (8 fake CPU devices from tests/conftest.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from horizon.utils.config import load_config_file
from horizon.model import transformer

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
