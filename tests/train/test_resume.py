"""Exact resume of experiments/pretrain.py (docs/SPEC.md §8): SIGKILL a real run after a checkpoint is
committed, restart it, and require the redone steps to match the killed run's own logs bitwise."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
STEPS, EVERY = 24, 4


def _corpus(root: pathlib.Path) -> None:
    rng = np.random.default_rng(0)
    words = ["def", "return", "self", "import", "jax", "for", "in", "range", "(", ")", ":", "\n"]
    (root / "corpus").mkdir(parents=True)
    for i in range(24):
        (root / "corpus" / f"m{i}.py").write_text(" ".join(rng.choice(words, size=200)))


def _cmd(tmp: pathlib.Path, workdir: str) -> list[str]:
    o = dict(data=dict(root=tmp, sources="corpus", heldout_fraction=0.2, seq_len=32, batch_size=2),
             model=dict(num_layers=2, d_model=32),
             train=dict(steps=STEPS, warmup_steps=2, checkpoint_every=EVERY, max_checkpoints=2,
                        log_every=1, eval_every=10, eval_batches=1, compilation_cache_dir=tmp / "xla_cache"))
    flags = [f"--config.{sec}.{k}={v}" for sec, kv in o.items() for k, v in kv.items()]
    return [sys.executable, str(REPO / "experiments" / "pretrain.py"), "--config=configs/tiny.py",
            f"--config.train.output_dir={tmp / workdir}", *flags]


def _records(workdir: pathlib.Path) -> list[dict]:
    p = workdir / "metrics.jsonl"
    if not p.exists():
        return []
    lines = p.read_text().splitlines()
    return [json.loads(line) for line in lines[:-1] + ([lines[-1]] if lines and lines[-1].endswith("}") else [])]


def _committed(workdir: pathlib.Path) -> list[int]:
    d = workdir / "checkpoints"
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.exists() else []


def _train(recs):
    # Everything a step computes; tokens_per_s is wall-clock and excluded.
    return {r["step"]: (r["loss"], r["grad_norm"], r["lr"], r.get("eval_loss")) for r in recs if "loss" in r}


def test_sigkill_then_resume_is_bitwise_exact(tmp_path):
    _corpus(tmp_path)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    run = tmp_path / "run"
    proc = subprocess.Popen(_cmd(tmp_path, "run"), cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        ck = _committed(run)
        if ck and max(r["step"] for r in _records(run)) > ck[-1]:
            proc.send_signal(signal.SIGKILL)  # mid-run: past a committed checkpoint
            break
        time.sleep(0.02)
    rc = proc.wait(timeout=60)
    assert rc == -signal.SIGKILL, f"run was not killed mid-way (rc={rc}): {proc.stderr.read()[-2000:]}"
    before = _train(_records(run))
    last_ckpt = _committed(run)[-1]
    assert last_ckpt >= EVERY and last_ckpt < STEPS

    out = subprocess.run(_cmd(tmp_path, "run"), cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resumed from {run / 'checkpoints'}/{last_ckpt}" in out.stdout
    after = _train(_records(run))
    assert sorted(after) == list(range(1, STEPS + 1))  # one record per step: no duplicates, no gaps
    redone = [s for s in before if s > last_ckpt]
    if not redone:  # killed right at a checkpoint: compare against a fresh uninterrupted run instead
        ref = subprocess.run(_cmd(tmp_path, "ref"), cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert ref.returncode == 0, ref.stderr[-3000:]
        before, redone = _train(_records(tmp_path / "ref")), list(range(last_ckpt + 1, STEPS + 1))
    print(f"killed past checkpoint {last_ckpt}; comparing redone steps {redone}")
    for s in redone:
        assert after[s] == before[s], (s, after[s], before[s])  # exact float equality
    for s in before:  # the records kept from before the kill are untouched
        assert after[s] == before[s]
    assert (run / "loss_curve.png").stat().st_size > 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_eval_loss"] < summary["init_eval_loss"]
