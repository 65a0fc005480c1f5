"""Watching a run (docs/SPEC.md §7.1, §7.2): the metrics writer's backends agree with metrics.jsonl,
progress is a bar on a terminal and plain lines elsewhere, results carry their provenance."""

import json
import os
import pathlib
import pty
import re
import select
import subprocess
import sys
import time

import ml_collections
import pytest

from horizon.utils import progress, provenance
from horizon.utils.config import ConfigError
from horizon.utils.tracking import MetricsWriter, TrackingConfig, read_scalars, tracking_fields

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _config(**wandb):
    c = ml_collections.ConfigDict(dict(seed=3, exp=tracking_fields(), rl=dict(lr=1e-3, sizes=(2, 4))))
    c.exp.wandb.update(wandb)
    return c


def test_writer_backends_agree_with_the_jsonl(tmp_path, wandb_runs, tensorboard_equals_jsonl):
    c = _config(project="horizon-test", group="g1")
    with MetricsWriter(tmp_path, c) as log:
        for s in range(1, 4):
            log(dict(phase="rl", step=s, reward_mean=0.25 * s, solved=s > 1, note="text is not a scalar",
                     passes=[0.1, 0.2], nested=dict(a=float(s)), bad=float("nan")))
        log(dict(phase="eval", step=0, heldout_mean=0.5))
        log(dict(phase="eval", step=3, heldout_mean=0.75, run="seed 0 self_summary"))
        log.histograms(3, {"rewards": [0.0, 1.0, 1.0], "staleness": []})
        log.table("eval/passes", [dict(step=3, pass_index=0, success=0.5)], 3)
        log.text("rl/transcript", "<function=set>...</function>", 1)
    log.close()                                                      # a second close is a no-op
    assert tensorboard_equals_jsonl(tmp_path) == 3 * 3 + 1     # reward_mean, solved, nested/a; eval
    assert read_scalars(tmp_path / "seed_0_self_summary") == {"eval/heldout_mean": [(3, 0.75)]}
    assert [json.loads(x)["reward_mean"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()[:3]] == [
        0.25, 0.5, 0.75]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    tags = acc.Tags()
    assert tags["histograms"] == ["rl/rewards"]                       # an empty histogram is skipped
    assert {"config/text_summary", "eval/passes/text_summary", "rl/transcript/text_summary"} <= set(tags["tensors"])
    (run,) = wandb_runs(tmp_path)                                       # offline: out_dir/wandb/offline-run-*
    name, group, rows = run
    assert (name, group) == (tmp_path.name, "g1")
    logged = {k for r in rows for k in r if not k.startswith("_")}
    assert {"rl/step", "rl/reward_mean", "rl/solved", "rl/nested/a", "eval/heldout_mean",
            "seed_0_self_summary/eval/heldout_mean", "rl/rewards/_type"} <= logged    # a histogram
    assert [r["rl/reward_mean"] for r in rows if "rl/reward_mean" in r] == [0.25, 0.5, 0.75]


def test_tracking_config_rejects_bad_values_before_writing(tmp_path):
    c = _config(mode="sometimes")
    with pytest.raises(ConfigError, match=r"exp\.wandb\.mode='sometimes'"):
        MetricsWriter(tmp_path / "run", c)
    assert TrackingConfig.from_config(ml_collections.ConfigDict(dict(seed=0))) == TrackingConfig()


def test_plain_progress_lines_have_eta_and_no_bar_characters(monkeypatch, capsys):
    monkeypatch.delenv("HORIZON_PROGRESS", raising=False)
    assert progress.mode() == "plain"                                # pytest's captured stderr is no terminal
    bar = progress.progress(total=4, desc="phase", unit="step", every_s=0.0)
    assert isinstance(bar, progress.PlainProgress)
    bar.update(1)
    bar.set_postfix(loss=0.5)
    bar.update(1)
    bar.close()
    err = capsys.readouterr().err.splitlines()
    assert re.fullmatch(r"phase: 1/4 step \(25%\), 00:00 elapsed, ETA 00:00", err[0]), err
    assert err[-1].startswith("phase: 2/4 step (50%), done in 00:00, loss=0.5")
    monkeypatch.setenv("HORIZON_PROGRESS", "sometimes")
    with pytest.raises(ValueError, match="HORIZON_PROGRESS='sometimes'"):
        progress.mode()


def test_provenance_fields():
    c = ml_collections.ConfigDict(dict(seed=7, a=1))
    p = provenance.Provenance.start(c)
    f = p.fields()
    assert set(f) == set(provenance.FIELDS)
    commit, dirty = provenance.git_state(ROOT)
    assert f["git_commit"] == commit and re.fullmatch(r"[0-9a-f]{40}|unknown", commit) and f["git_dirty"] == dirty
    assert f["seeds"] == [7] and f["wall_s"] >= 0 and len(f["loadavg_start"]) == 3
    assert f["config_hash"] == provenance.config_hash(ml_collections.ConfigDict(dict(a=1, seed=7)))  # key order
    assert f["config_hash"] != provenance.config_hash(ml_collections.ConfigDict(dict(seed=7, a=2)))


def _pretrain_cmd(out):
    return [sys.executable, str(ROOT / "experiments" / "pretrain.py"), "--config.train.steps=8",
            "--config.train.warmup_steps=1", "--config.train.log_every=4", "--config.train.eval_every=8",
            "--config.train.eval_batches=1", "--config.train.checkpoint_every=100", "--config.model.num_layers=1",
            "--config.data.sources=('configs',)", "--config.train.compilation_cache_dir=",
            f"--config.train.output_dir={out}"]


def _run_in_pty(cmd, env, timeout_s=240.0) -> str:
    """`cmd`'s combined output with stdout and stderr on a pseudo-terminal."""
    leader, follower = pty.openpty()
    p = subprocess.Popen(cmd, stdout=follower, stderr=follower, stdin=subprocess.DEVNULL, cwd=ROOT, env=env)
    os.close(follower)
    out, deadline = b"", time.time() + timeout_s
    while time.time() < deadline:
        if select.select([leader], [], [], 1.0)[0]:
            try:
                chunk = os.read(leader, 65536)
            except OSError:                 # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        elif p.poll() is not None:
            break
    p.wait(timeout=30)
    os.close(leader)
    assert p.returncode == 0, out.decode(errors="replace")[-2000:]
    return out.decode(errors="replace")


def test_a_driver_shows_a_bar_on_a_terminal_and_plain_lines_in_a_pipe(tmp_path, tensorboard_equals_jsonl):
    env = {k: v for k, v in os.environ.items() if k != "HORIZON_PROGRESS"}
    env["PYTHONPATH"] = str(ROOT / "src")
    tty = _run_in_pty(_pretrain_cmd(tmp_path / "tty"), env)
    assert re.search(r"pretrain: +\d+%\|.*\| \d+/8 \[\d\d:\d\d<\d\d:\d\d", tty), tty[-2000:]   # bar with an ETA
    assert "\r" in tty
    piped = subprocess.run(_pretrain_cmd(tmp_path / "pipe"), cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=240)
    assert piped.returncode == 0, piped.stderr[-2000:]
    both = piped.stdout + piped.stderr
    assert re.search(r"^pretrain: 8/8 step \(100%\), done in \d\d:\d\d, loss=", both, re.M), both[-2000:]
    assert "\r" not in both and "%|" not in both and "█" not in both
    for run in ("tty", "pipe"):                                 # the driver's summary and events, both ways
        summary = json.loads((tmp_path / run / "summary.json").read_text())
        assert set(summary["provenance"]) == set(provenance.FIELDS) and summary["provenance"]["seeds"] == [0]
        assert tensorboard_equals_jsonl(tmp_path / run) > 0
