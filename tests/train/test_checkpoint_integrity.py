"""Checkpoint integrity (docs/SPEC.md §4.1 "Fault tolerance"): every saved step
carries a sha256 manifest; a corrupt latest step is reported and the previous intact one restored
(`Checkpointer.restore_latest`, `restore_params`, `rl.runtime.core.resume_rl_state`); a named corrupt
step or an all-corrupt directory is a one-line `CheckpointCorruptError`."""

import dataclasses
import logging
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from horizon.train import checkpoint, lm
from horizon.train.checkpoint import MANIFEST_NAME, CheckpointCorruptError, Checkpointer

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORRUPT_BYTES = 16          # the reproducer: 16 overwritten bytes inside an orbax data file
LOGGER = "horizon.train.checkpoint"


def _corrupt(step_dir: pathlib.Path) -> str:
    """Flip CORRUPT_BYTES bytes in the middle of the step's largest data file; its relative path."""
    files = [p for p in step_dir.rglob("*") if p.is_file() and p.name != MANIFEST_NAME]
    big = max(files, key=lambda p: p.stat().st_size)
    at = max(0, big.stat().st_size // 2 - CORRUPT_BYTES // 2)
    with open(big, "r+b") as f:
        f.seek(at)
        chunk = f.read(CORRUPT_BYTES)
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in chunk))
    return big.relative_to(step_dir).as_posix()


def _assert_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))   # bitwise


def _messages(caplog, level):
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


@pytest.fixture(scope="module")
def states():
    """TrainStates of steps 1..3 (params shifted by the step, so each step's values differ)."""
    from tests.train.conftest import small_config

    base = lm.init_state(jax.random.PRNGKey(0), small_config())
    return {k: base._replace(step=jnp.asarray(k, jnp.int32), params=jax.tree.map(lambda x, k=k: x + k, base.params))
            for k in (1, 2, 3)}


def _save(directory, states, steps, keep=2):
    ck = Checkpointer(directory, every=1, keep=keep)
    for k in steps:
        assert ck.save(k, states[k], {"data_step": k})
    ck.close()


def test_clean_round_trip_exact_with_manifests_and_retention(tmp_path, states, caplog):
    d = tmp_path / "ck"
    _save(d, states, (1, 2))
    for k in (1, 2):
        assert (d / str(k) / MANIFEST_NAME).is_file()
        assert checkpoint.verify_step(d, k) is True
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        ck = Checkpointer(d, every=1, keep=2)
        assert ck.all_steps() == [1, 2]                 # orbax's step discovery ignores the manifest
        got, meta = ck.restore_latest(states[1])
        _assert_equal(got, states[2])
        assert meta == {"data_step": 2}
        _assert_equal(ck.restore(1, states[1])[0], states[1])
        assert ck.save(3, states[3], {"data_step": 3})  # keep=2: step 1 goes, manifest and all
        assert ck.all_steps() == [2, 3] and not (d / "1").exists()
        ck.close()
    assert not [r for r in caplog.records if r.name == LOGGER]


def test_corrupt_latest_step_falls_back_to_previous(tmp_path, states, caplog, cfg):
    d = tmp_path / "ck"
    _save(d, states, (1, 2))
    bad = _corrupt(d / "2")
    ck = Checkpointer(d, every=1, keep=2)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got, meta = ck.restore_latest(states[1])
    _assert_equal(got, states[1])
    assert meta == {"data_step": 1}
    errors = _messages(caplog, logging.ERROR)
    assert len(errors) == 1 and "step 2" in errors[0] and bad in errors[0] and "\n" not in errors[0]

    # a step the caller names is never swapped for another
    with pytest.raises(CheckpointCorruptError, match=f"step 2 .*{bad}"):
        ck.restore(2, states[1])
    # the one params loader falls back the same way
    params, pmeta = checkpoint.restore_params(d, cfg.model)
    assert pmeta["step"] == 1
    _assert_equal(params, states[1].params)
    # the resumed run redoes step 2: its save replaces the corrupt step
    assert ck.save(2, states[2], {"data_step": 2})
    assert checkpoint.verify_step(d, 2) is True
    _assert_equal(ck.restore_latest(states[1])[0], states[2])
    ck.close()


def test_every_step_corrupt_is_one_line_error(tmp_path, states, cfg):
    d = tmp_path / "ck"
    _save(d, states, (1, 2))
    bad = {k: _corrupt(d / str(k)) for k in (1, 2)}
    ck = Checkpointer(d, every=1, keep=2)
    with pytest.raises(CheckpointCorruptError) as e:
        ck.restore_latest(states[1])
    msg = str(e.value)
    assert "\n" not in msg and "step 2" in msg and bad[2] in msg and "step 1" in msg
    ck.close()
    with pytest.raises(CheckpointCorruptError, match="no intact checkpoint"):
        checkpoint.restore_params(d, cfg.model)


def test_step_without_manifest_restores_unverified_with_warning(tmp_path, states, caplog):
    d = tmp_path / "ck"
    _save(d, states, (1, 2))
    (d / "2" / MANIFEST_NAME).unlink()               # as written before manifests existed
    ck = Checkpointer(d, every=1, keep=2)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got, _ = ck.restore_latest(states[1])
    _assert_equal(got, states[2])
    warnings = _messages(caplog, logging.WARNING)
    assert len(warnings) == 1 and "unverified" in warnings[0]
    assert not ck.save(2, states[2], {"data_step": 2})   # an unverified step is not rewritten
    ck.close()


def test_rl_resume_falls_back_over_corrupt_latest_step(tmp_path, caplog):
    from horizon.model.params import numpy_init
    from horizon.rl.runtime import core as runtime
    from horizon.utils.config import load_config_file

    c = load_config_file(ROOT / "configs" / "rl_async.py")
    c.model.num_layers, c.model.d_model = 2, 32
    c.rl.max_checkpoints = 2
    params = numpy_init(c.model, 3)
    state, ck, meta = runtime.resume_rl_state(params, c, tmp_path / "ckpt")
    assert meta is None
    saved = {}
    for k in (1, 2):
        saved[k] = dataclasses.replace(state, step=jnp.asarray(k, jnp.int32),
                                       params=jax.tree.map(lambda x, k=k: x + k, state.params))
        assert ck.save(k, saved[k], {"step": k}, force=True)
    ck.close()
    bad = _corrupt(tmp_path / "ckpt" / "2")

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        back, ck, meta = runtime.resume_rl_state(params, c, tmp_path / "ckpt")
    ck.close()
    assert meta == {"step": 1}
    _assert_equal(back, saved[1])
    assert any("step 2" in m and bad in m for m in _messages(caplog, logging.ERROR))
