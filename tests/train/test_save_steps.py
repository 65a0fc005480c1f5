"""Pretraining budgets a later run starts from (docs/SPEC.md §7, docs/RESULTS.md "pretrain_rl"): `train.save_steps`
checkpoints and evaluates its steps (0 = the init) and keeps each step's held-out loss in the checkpoint's meta;
`restore_params(step=)` reads that step; `model.init_checkpoint` / `model.init_step` start a run from it."""

import json
import pathlib

import jax
import numpy as np
import pytest

from horizon.rl.runtime import checks, warmstart
from horizon.studies import arms
from horizon.train import checkpoint, lm, loop
from horizon.utils.config import ConfigError, load_config_file
from horizon.utils.provenance import Provenance
from horizon.utils.seeds import run_keys

STEPS, BUDGETS = 6, (0, 2, 6)


def _config(tmp: pathlib.Path):
    c = load_config_file("configs/tiny.py")
    rng = np.random.default_rng(0)
    (tmp / "code").mkdir()
    words = ["def", "return", "self", "import", "jax", "for", "in", "range", "(", ")", ":", "\n"]
    for i in range(16):
        (tmp / "code" / f"m{i}.py").write_text(" ".join(rng.choice(words, size=120)))
    c.data.update(dict(root=str(tmp), sources=("code",), heldout_fraction=0.25, seq_len=16, batch_size=2))
    c.model.update(dict(num_layers=2, d_model=32))
    c.train.update(dict(steps=STEPS, warmup_steps=1, log_every=1, eval_every=4, eval_batches=1,
                        checkpoint_every=STEPS, max_checkpoints=len(BUDGETS), save_steps=BUDGETS,
                        output_dir=str(tmp / "pt"), compilation_cache_dir=""))
    return c


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("save_steps")
    c = _config(tmp)
    lm.validate_train_config(c)
    _, state = loop.train_stage(c, Provenance.start(c))
    return c, tmp / "pt", state


def test_the_budgets_are_checkpointed_with_their_held_out_loss(run):
    c, out, state = run
    assert checkpoint.saved_steps(out / "checkpoints") == list(BUDGETS)
    evals = {r["step"]: r["eval_loss"] for r in loop.read_records(out / "metrics.jsonl") if "eval_loss" in r}
    assert set(BUDGETS) <= set(evals)          # step 2 is no multiple of eval_every: evaluated for its budget
    for step in BUDGETS:
        meta = checkpoint.restore_meta(out / "checkpoints", step)
        assert meta["data_step"] == step and meta["eval_loss"] == pytest.approx(evals[step], rel=0, abs=0)


def test_restore_params_reads_the_named_step(run):
    c, out, state = run
    init = lm.init_state(jax.random.key_data(run_keys(c.seed)["init"]), c).params
    p0, meta0 = checkpoint.restore_params(out / "checkpoints", c.model, step=0)
    last, meta = checkpoint.restore_params(out / "checkpoints", c.model)
    assert meta0["step"] == 0 and meta["step"] == STEPS
    for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(init)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))    # step 0 is the init, bit for bit
    for a, b in zip(jax.tree.leaves(last), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(FileNotFoundError, match="no checkpoint step 3"):
        checkpoint.restore_params(out / "checkpoints", c.model, step=3)


def test_a_run_starts_from_a_budget_and_records_it(run):
    c, out, _ = run
    rl = load_config_file("configs/rl_tiny.py")
    rl.model.update(dict(num_layers=2, d_model=32, init_checkpoint=str(out / "checkpoints"), init_step=2))
    checks.validate_init_checkpoint(rl.model)
    got = warmstart.initial_params(rl, jax.random.key(1))
    want = checkpoint.restore_params(out / "checkpoints", c.model, step=2)[0]
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    rec = arms.init_record(rl)
    assert rec["step"] == 2 and rec["eval_loss"] == checkpoint.restore_meta(out / "checkpoints", 2)["eval_loss"]
    assert json.dumps(rec)                      # a ledger row's field: plain JSON
    rl.model.init_step = -1
    assert arms.init_record(rl)["step"] == STEPS


@pytest.mark.parametrize("update, match", [
    (dict(init_checkpoint="/nonexistent/checkpoints"), "holds no checkpoint steps"),
    (dict(init_step=3), "model.init_step=3: is not among"),
    (dict(init_from="/some/hf_dir"), "model.init_from are both set"),
])
def test_a_bad_start_is_one_line_before_any_work(run, update, match):
    _, out, _ = run
    rl = load_config_file("configs/rl_tiny.py")
    rl.model.update(dict(init_checkpoint=str(out / "checkpoints"), init_step=2))
    rl.model.update(update)
    with pytest.raises(ConfigError, match=match):
        checks.validate_init_checkpoint(rl.model)


@pytest.mark.parametrize("update, match", [
    (dict(save_steps=(0, 7)), r"train.save_steps=\(0, 7\): must be integer steps in \[0, train.steps=6\]"),
    (dict(max_checkpoints=2), "train.max_checkpoints=2: must be >= the 3 steps"),
    (dict(checkpoint_every=2), "train.max_checkpoints=3: must be >= the 4 steps"),
])
def test_save_steps_that_would_be_deleted_or_never_reached_are_refused(tmp_path, update, match):
    c = _config(tmp_path)
    c.train.update(update)
    with pytest.raises(ConfigError, match=match):
        lm.validate_train_config(c)
