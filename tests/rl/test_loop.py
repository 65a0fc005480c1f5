"""horizon.rl.loop pieces that need no sandbox: the two-stage warm start and its checkpoints."""

from __future__ import annotations

import pathlib

import jax
import numpy as np

from horizon.data.tokenizer import ByteTokenizer
from horizon.rl import loop
from horizon.tasks.families import family_from_config

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _cfg(**sft):
    c = loop.load_experiment(str(ROOT / "configs" / "rl_tiny.py"), [], env="config_edit")
    c.model.num_layers, c.model.d_model = 2, 32          # small compiles
    c.exp.n_sft_tasks = 16
    c.exp.sft.batch_size = 4
    c.exp.sft.log_every = 1
    for k, v in sft.items():
        c.exp.sft[k] = v
    return c


def test_two_stage_warm_start_writes_both_checkpoints_and_reloads(tmp_path):
    c = _cfg(clean_steps=2, steps=3)
    recs = []
    fam = family_from_config(c.exp)
    p = loop.config_edit_warm_start(c, fam, ByteTokenizer(c.model.vocab_size), tmp_path, recs.append,
                                    loop.experiment_keys(c)["init"])
    # stage sizes come from the config (the clean stage's `steps` override does not leak into stage 2)
    assert [r["step"] for r in recs if r["phase"] == "sft_clean"] == [1, 2]
    assert [r["step"] for r in recs if r["phase"] == "sft"] == [1, 2, 3]
    assert c.exp.sft.steps == 3 and (tmp_path / "sft_clean" / "2").is_dir() and (tmp_path / "sft" / "3").is_dir()
    back = loop.load_sft_params(c, tmp_path / "sft")     # what experiments/rl_async.py starts from
    for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(back)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # a rerun restores the finished stage 2 instead of training again
    again = loop.config_edit_warm_start(c, fam, ByteTokenizer(c.model.vocab_size), tmp_path, recs.append,
                                        loop.experiment_keys(c)["init"])
    assert len(recs) == 5
    for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(again)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_load_sft_params_without_checkpoint_says_so(tmp_path):
    import pytest

    with pytest.raises(FileNotFoundError, match="no SFT checkpoint"):
        loop.load_sft_params(_cfg(), tmp_path / "missing")
