"""Shared tiny training config for tests/train (small shapes: compile time dominates on CPU)."""

import numpy as np
import pytest

from horizon.utils.config import load_config_file


def small_config():
    c = load_config_file("configs/tiny.py")
    c.model.d_model = 32
    c.model.num_layers = 2          # one dense + one MoE layer
    c.data.seq_len = 16
    c.data.batch_size = 2
    c.train.steps = 50
    c.train.warmup_steps = 2
    return c


@pytest.fixture()
def cfg():
    return small_config()


def make_batch(cfg, seed=0):
    """A packed batch with two segments per row and some padding."""
    rng = np.random.default_rng(seed)
    b, s = cfg.data.batch_size, cfg.data.seq_len
    tokens = rng.integers(0, 256, size=(b, s)).astype(np.int32)
    seg = np.zeros((b, s), np.int32)
    cut, end = s // 2, s - 3
    seg[:, :cut], seg[:, cut:end] = 1, 2
    pos = np.where(seg == 1, np.arange(s), np.arange(s) - cut).astype(np.int32) * (seg > 0)
    tokens[seg == 0] = 256
    return {"tokens": tokens, "segment_ids": seg, "positions": pos, "mask": (seg > 0).astype(np.float32)}
