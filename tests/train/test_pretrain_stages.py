"""experiments/pretrain.py with stages (docs/SPEC.md §1.4, §8), end to end at tiny lengths: the short stage,
the long-context eval of the short model (its own RoPE and the long stage's YaRN), the long stage from the
short stage's params, the eval after it; a rerun resumes both stages and keeps the evals."""

import importlib.util
import json
import pathlib

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHORT, LONG = 80, 320


def _driver():
    spec = importlib.util.spec_from_file_location("drv_pretrain_stages", ROOT / "experiments" / "pretrain.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _argv(tmp: pathlib.Path) -> list[str]:
    o = {"data": dict(root=tmp, sources="('code',)", heldout_fraction=0.3, seq_len=SHORT, batch_size=2,
                      passkey_fraction=0.1),
         "model": dict(num_layers=1, d_model=32, max_seq_len=SHORT),
         "train": dict(steps=8, warmup_steps=1, log_every=4, eval_every=8, eval_batches=1, checkpoint_every=8,
                       output_dir=tmp / "run", compilation_cache_dir=""),
         "stages.long": dict(seq_len=LONG, batch_size=1, steps=3, warmup_steps=1, eval_every=3, checkpoint_every=3),
         "long_eval": dict(multiples="(1, 4)", passkey_docs=4, heldout_docs=2, batch_size=1)}
    flags = [f"--config.{sec}.{k}={v}" for sec, kv in o.items() for k, v in kv.items()]
    return ["--config=configs/pretrain_long.py", *flags]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stages")
    rng = np.random.default_rng(0)
    (tmp / "code").mkdir()
    for i in range(30):
        (tmp / "code" / f"m{i}.py").write_text(" ".join(rng.choice(["def", "return", "x", "=", "\n"], size=400)))
    drv = _driver()
    return drv, tmp, drv.main(_argv(tmp))


def _records(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_two_stages_write_their_metrics_and_the_evals(run):
    _, tmp, summary = run
    out = tmp / "run"
    for name, steps, seq in (("short", 8, SHORT), ("long", 3, LONG)):
        recs = _records(out / name / "metrics.jsonl")
        assert sorted(r["step"] for r in recs if "loss" in r) == sorted({4, 8} & set(range(steps + 1)) | {steps})
        assert [r["step"] for r in recs if "eval_loss" in r] == [0, steps]
        cfg = json.loads((out / name / "config.json").read_text())
        assert cfg["data"]["seq_len"] == seq and (out / name / "checkpoints" / str(steps)).is_dir()
    assert json.loads((out / "long" / "config.json").read_text())["model"]["rope_scaling"] == dict(
        summary["rope_scaling_long"], type="yarn", factor=4.0, original_max_position_embeddings=SHORT)
    evals = [r for r in _records(out / "metrics.jsonl") if r.get("phase", "").startswith("long_context/")]
    assert [(r["phase"], r["step"]) for r in evals] == [("long_context/short", 8), ("long_context/short_yarn", 8),
                                                       ("long_context/long", 11)]
    keys = {"loss_0_80", "tokens_0_80", "loss_80_320", "tokens_80_320", "passkey_acc_80", "passkey_digit_acc_80",
            "passkey_acc_320", "passkey_digit_acc_320"}
    on_disk = json.loads((out / "summary.json").read_text())
    assert set(on_disk["long_context"]) == {"short", "short_yarn", "long"}
    for rec in on_disk["long_context"].values():
        assert set(rec) == keys and rec["tokens_0_80"] == 2 * 79 and 0 <= rec["passkey_acc_320"] <= 1
    assert on_disk["long_context"]["short"] != on_disk["long_context"]["short_yarn"]   # YaRN changes the model
    # the long stage starts from the short stage's params, not from a fresh init
    s, lg = on_disk["stages"]["short"], on_disk["stages"]["long"]
    assert lg["init_eval_loss"] < s["init_eval_loss"] - 0.5, (s, lg)
    assert on_disk["provenance"]["loadavg_start"] is not None


@pytest.mark.slow
def test_a_rerun_resumes_both_stages_and_keeps_the_evals(run):
    drv, tmp, first = run
    again = drv.main(_argv(tmp))
    assert again["long_context"] == first["long_context"]
    evals = [r for r in _records(tmp / "run" / "metrics.jsonl") if "phase" in r]
    assert len(evals) == 3                                   # reused, not recomputed
    for name in ("short", "long"):
        assert again["stages"][name]["final_eval_loss"] == first["stages"][name]["final_eval_loss"]
