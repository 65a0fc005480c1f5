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
    assert all(line["provenance"]["config_hash"] and line["provenance"]["git_commit"] for line in lines)
    assert "provenance" not in md                              # nested field: in the JSON files, not the table
    for r in rows:
        info = json.loads((out / r["run"] / "sweep_run.json").read_text())
        assert info["git_commit"] == sweep.git_commit(REPO) and info["git_commit"]
        assert info["provenance"]["git_commit"] == info["git_commit"] and info["provenance"]["wall_s"] >= 0
        cfg = json.loads((out / r["run"] / "config.json").read_text())
        assert cfg["train"]["lr"] == r["train.lr"] and cfg["train"]["steps"] == 3
    assert (out / "curves.png").stat().st_size > 1000


WANDB_CONFIG = '''
import ml_collections
def get_config():
    c = ml_collections.ConfigDict(); c.seed = 0; c.out = ""
    c.exp = ml_collections.ConfigDict(dict(wandb=ml_collections.ConfigDict(dict(project="", group="", name=""))))
    return c
'''


def test_sweep_names_and_groups_wandb_runs(tmp_path):
    """A member whose config has exp.wandb gets group = the sweep's NAME and name = its run name,
    unless the sweep sets them; a config without exp gets neither (the test above)."""
    from horizon.eval import sweep
    (tmp_path / "wb_cfg.py").write_text(WANDB_CONFIG)
    (tmp_path / "sw.py").write_text(f"CONFIG = {str(tmp_path / 'wb_cfg.py')!r}\nOUT_FIELD = 'out'\n"
                                    "NAME = 'wbsweep'\ndef get_sweep():\n"
                                    "    return [{'seed': 1}, {'seed': 2, 'exp.wandb.name': 'mine'}]\n")
    rows = sweep.run_sweep(tmp_path / "sw.py", tmp_path / "o", root=REPO, dry_run=True)
    got = []
    for r in rows:
        info = json.loads((tmp_path / "o" / r["run"] / "sweep_run.json").read_text())
        cfg = json.loads((tmp_path / "o" / r["run"] / "config.json").read_text())
        assert sum(a.startswith("--config.exp.wandb.name=") for a in info["command"]) == 1
        assert "provenance" in r and r["provenance"]["seeds"] == [r["seed"]]
        got.append((cfg["exp"]["wandb"]["group"], cfg["exp"]["wandb"]["name"]))
    assert got == [("wbsweep", rows[0]["run"]), ("wbsweep", "mine")]


TRACKED_SCRIPT = '''
import pathlib, sys
sys.path.insert(0, {src!r})
from horizon.utils import cli
from horizon.utils.tracking import MetricsWriter
c = cli.load(sys.argv[1:], default="", validate=lambda c: None)
with MetricsWriter(pathlib.Path(c.out), c) as log:
    for s in range(1, 4):
        log({{"phase": "train", "step": s, "loss": c.train.lr * s}})
'''

TRACKED_CONFIG = '''
import ml_collections
from horizon.utils.tracking import tracking_fields
def get_config():
    c = ml_collections.ConfigDict(); c.seed = 0; c.out = ""
    c.train = ml_collections.ConfigDict(dict(lr=0.1))
    c.exp = ml_collections.ConfigDict(tracking_fields())
    return c
'''


def test_a_sweep_of_two_members_writes_two_tensorboard_and_wandb_runs(tmp_path, wandb_runs, tensorboard_equals_jsonl):
    """Each member logs through the library's MetricsWriter to its own run dir: `tensorboard --logdir
    <out>` lists two runs, and with exp.wandb.project set two offline W&B runs named after the members,
    grouped by the sweep."""
    from horizon.eval import sweep
    from horizon.utils.tracking import read_scalars
    (tmp_path / "tracked.py").write_text(TRACKED_SCRIPT.format(src=str(REPO / "src")))
    (tmp_path / "tracked_cfg.py").write_text(TRACKED_CONFIG)
    (tmp_path / "sw.py").write_text(
        f"SCRIPT = {str(tmp_path / 'tracked.py')!r}\nCONFIG = {str(tmp_path / 'tracked_cfg.py')!r}\n"
        "OUT_FIELD = 'out'\nNAME = 'two'\nBASE_OVERRIDES = {'exp.wandb.project': 'horizon-test'}\n"
        "def get_sweep():\n    return [{'train.lr': 0.1}, {'train.lr': 0.2}]\n")
    rows = sweep.run_sweep(tmp_path / "sw.py", tmp_path / "out", root=REPO)
    assert [r["returncode"] for r in rows] == [0, 0]
    for r, lr in zip(rows, (0.1, 0.2)):
        run_dir = tmp_path / "out" / r["run"]
        assert tensorboard_equals_jsonl(run_dir) == 3
        assert [v for _, v in read_scalars(run_dir)["train/loss"]] == pytest.approx([lr, 2 * lr, 3 * lr])
        (name, group, hist), = wandb_runs(run_dir)
        assert (name, group) == (r["run"], "two")
        assert [h["train/loss"] for h in hist if "train/loss" in h] == pytest.approx([lr, 2 * lr, 3 * lr])


def test_overrides_given_to_the_sweep_apply_to_every_run_last_and_name_its_output(tmp_path, monkeypatch):
    """experiments/sweep.py --config.seed=1: every member gets it after the sweep's own overrides, and the
    default output dir carries it, so a second seed never resumes the first one's runs."""
    from horizon.eval import sweep
    from horizon.utils import cli
    (tmp_path / "fake_cfg.py").write_text(FAKE_CONFIG)
    (tmp_path / "sw.py").write_text(f"CONFIG = {str(tmp_path / 'fake_cfg.py')!r}\nOUT_FIELD = 'out'\n"
                                    "BASE_OVERRIDES = {'seed': 0}\n"
                                    "def get_sweep():\n    return [{'train.lr': 0.1}, {'train.lr': 0.2, 'seed': 5}]\n")
    common = cli.overrides(["--config.seed=1", "--config.train.steps=7"])
    assert common == {"seed": "1", "train.steps": "7"}
    rows = sweep.run_sweep(tmp_path / "sw.py", root=tmp_path, dry_run=True, common=common)
    assert [r["seed"] for r in rows] == [1, 1]
    out = tmp_path / "runs" / "sweeps" / "sw+seed=1+steps=7"
    for r in rows:
        info = json.loads((out / r["run"] / "sweep_run.json").read_text())
        assert info["common_overrides"] == common and "--config.train.steps=7" in info["command"]
    with pytest.raises(cli.ConfigError, match="unexpected argument '--seed=1'"):
        cli.overrides(["--seed=1"])
    drv = _load("drv_sweep", REPO / "experiments" / "sweep.py")
    with pytest.raises(SystemExit) as e:
        drv.main([f"--sweep={tmp_path / 'sw.py'}", "--dry_run", "--config.train.nope=1"])
    assert e.value.code == 2


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
