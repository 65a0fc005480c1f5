"""experiments/sweep.py on a trivial fake experiment, experiments/plot.py, and load_params round trip."""

import importlib.util
import json
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

FAKE_SCRIPT = '''
import json, pathlib, sys
sys.path.insert(0, {src!r})
from horizon.utils import cli
c = cli.load(sys.argv[1:], default="", validate=lambda c: None)
out = pathlib.Path(c.out); out.mkdir(parents=True, exist_ok=True)
if c.train.lr > 1: sys.exit(3)
with open(out / "metrics.jsonl", "w") as f:
    for s in range(1, 4): f.write(json.dumps({{"step": s, "loss": c.train.lr * s}}) + "\\n")
(out / "summary.json").write_text(json.dumps({{"final_loss": c.train.lr * 3, "seed": c.seed}}))
'''

FAKE_CONFIG = '''
import ml_collections
def get_config():
    c = ml_collections.ConfigDict(); c.seed = 0; c.out = ""
    c.train = ml_collections.ConfigDict(dict(lr=0.1, steps=3))
    return c
'''


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sweep_runs_three_configs_and_writes_summary(tmp_path):
    from horizon.eval import sweep
    (tmp_path / "fake.py").write_text(FAKE_SCRIPT.format(src=str(REPO / "src")))
    (tmp_path / "fake_cfg.py").write_text(FAKE_CONFIG)
    (tmp_path / "sw.py").write_text(
        f"SCRIPT = {str(tmp_path / 'fake.py')!r}\nCONFIG = {str(tmp_path / 'fake_cfg.py')!r}\n"
        "OUT_FIELD = 'out'\nBASE_OVERRIDES = {'train.steps': 3}\n"
        "def get_sweep():\n"
        "    return [{'train.lr': 0.1, 'seed': 1}, {'train.lr': 0.2, 'seed': 2}, {'train.lr': 5.0}]\n")
    out = tmp_path / "out"
    rows = sweep.run_sweep(tmp_path / "sw.py", out, root=REPO)
    assert [r["returncode"] for r in rows] == [0, 0, 3]          # the third run fails on purpose
    assert [r["seed"] for r in rows] == [1, 2, 0]
    assert rows[0]["final_loss"] == pytest.approx(0.3) and rows[1]["last/loss"] == pytest.approx(0.6)
    assert "final_loss" not in rows[2]
    lines = [json.loads(x) for x in (out / "summary.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and lines[1]["train.lr"] == 0.2
    md = (out / "summary.md").read_text()
    assert md.count("\n|") >= 4 and "final_loss" in md        # header + rule + 3 rows
    for r in rows:
        info = json.loads((out / r["run"] / "sweep_run.json").read_text())
        assert info["git_commit"] == sweep.git_commit(REPO) and info["git_commit"]
        cfg = json.loads((out / r["run"] / "config.json").read_text())
        assert cfg["train"]["lr"] == r["train.lr"] and cfg["train"]["steps"] == 3
    assert (out / "curves.png").stat().st_size > 1000


def test_sweep_rejects_unknown_override_and_git_unknown(tmp_path):
    from horizon.eval import sweep
    (tmp_path / "fake_cfg.py").write_text(FAKE_CONFIG)
    (tmp_path / "sw.py").write_text(f"CONFIG = {str(tmp_path / 'fake_cfg.py')!r}\n"
                                    "def get_sweep():\n    return [{'train.nope': 1}]\n")
    with pytest.raises(ValueError, match="unknown config field --config.train.nope"):
        sweep.run_sweep(tmp_path / "sw.py", tmp_path / "o", root=REPO, dry_run=True)
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())   # nothing ran, no run dir
    assert sweep.git_commit(tmp_path) == "unknown"          # not a git repo


def test_plot_cli_writes_png(tmp_path):
    plot = _load("plot_mod", REPO / "experiments" / "plot.py")
    m = tmp_path / "metrics.jsonl"
    m.write_text("".join(json.dumps({"step": s, "loss": 1.0 / s, "run": s % 2}) + "\n" for s in range(1, 6)))
    path = plot.main([str(m), "--x", "step", "--y", "loss", "--group", "run"])
    assert path.exists() and path.stat().st_size > 1000
    with pytest.raises(KeyError):
        plot.main([str(m), "--y", "nope"])


def test_load_params_round_trip(tmp_path):
    import jax
    import numpy as np

    from horizon.eval import load_params
    from horizon.model import transformer
    from horizon.train.checkpoint import Checkpointer
    from horizon.utils.config import load_config_file

    c = load_config_file(REPO / "configs" / "tiny.py")
    params = transformer.init(jax.random.key(3), c.model)
    with Checkpointer(tmp_path / "ck", every=1, keep=1) as ck:
        ck.save(5, {"step": np.int32(5), "params": params}, {"seed": 3}, force=True)
    got, meta = load_params(str(tmp_path / "ck"), c)
    assert meta["step"] == 5
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(got)))
    fresh, m0 = load_params("", c)
    assert m0["step"] == 0 and jax.tree.structure(fresh) == jax.tree.structure(params)
    c.model.d_model = 32
    with pytest.raises(ValueError):
        load_params(str(tmp_path / "ck"), c)


@pytest.mark.slow
def test_real_lr_sweep_of_tiny_pretraining(tmp_path):
    """configs/sweeps/lr_tiny.py end to end (3 x 20-step pretraining runs; ~1-4 min on 2 loaded cores)."""
    from horizon.eval import sweep
    rows = sweep.run_sweep(REPO / "configs" / "sweeps" / "lr_tiny.py", tmp_path / "lr", root=REPO)
    assert [r["returncode"] for r in rows] == [0, 0, 0]
    assert all(r["final_eval_loss"] < r["init_eval_loss"] for r in rows)   # each run learned something
    assert (tmp_path / "lr" / "summary.md").exists() and (tmp_path / "lr" / "curves.png").exists()
    for r in rows:
        assert (tmp_path / "lr" / r["run"] / "loss_curve.png").exists()
