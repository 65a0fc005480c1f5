"""experiments/rl.py with `rl.sampler.backend="remote"` against horizon's server reproduces the
in-process run: 3 RL steps from the same SFT checkpoints, every version pushed through the run's
weight store and `/admin/load`, the same metrics.jsonl (docs/SERVING.md). Slow: two RL runs."""

import json
import pathlib
import shutil

import ml_collections
import pytest

from horizon.data.tokenizer import tokenizer_from_config
from horizon.inference.config import engine_config
from horizon.inference.remote import ADMIN_TOKEN_ENV
from horizon.inference.server import make_app, serving
from horizon.inference.service import EngineService
from horizon.model.params import numpy_init
from horizon.rl.runtime.weight_sync import WeightReceiver
from horizon.utils.config import load_config_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
SETS = ["exp.steps=3", "rl.optim.warmup_steps=0", "exp.sft.clean_steps=2", "exp.sft.steps=2",
        "exp.sft.optim.warmup_steps=1", "exp.eval.n_tasks=4", "exp.eval.passes=1", "exp.eval.every=0",
        "exp.pool_size=8", "rl.prompts_per_step=2", "exp.n_sft_tasks=32", "exp.plot=false", "exp.backend=local",
        "agent.max_new_tokens=16", "rl.sampler.chunk_tokens=32"]
# Wall-clock and engine-internal fields: a remote run's engine is the server's (slot-steps, switches and
# compiles are counted there, not in the run), and seconds differ between any two runs.
CLOCK = ("_s", "per_s", "time/", "compile", "occupancy", "slot_steps", "switches", "wall", "load_avg", "engine_tokens")


def _records(out: pathlib.Path) -> list[dict]:
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not any(m in k for m in CLOCK)}
            for r in recs if r.get("phase") in ("rl", "eval")]


@pytest.mark.slow
def test_remote_rl_reproduces_in_process(tmp_path, monkeypatch, load_script):
    argv = [f"--config={ROOT / 'configs' / 'rl_tiny.py'}"] + [f"--config.{s}" for s in SETS]
    local, far = tmp_path / "local", tmp_path / "remote"
    _driver = lambda: load_script("experiments/rl.py")    # noqa: E731  (a fresh module per run)
    _driver().main(argv + [f"--config.exp.out_dir={local}"])
    far.mkdir()
    for d in ("sft_clean", "sft"):                                   # the same warm start, restored
        shutil.copytree(local / d, far / d)

    c = load_config_file(ROOT / "configs" / "serve_tiny.py")
    template = numpy_init(ml_collections.FrozenConfigDict(c.model), 5)     # any weights: the run pushes its own
    svc = EngineService(c, template)
    monkeypatch.setenv(ADMIN_TOKEN_ENV, "rl-test")
    app = make_app(svc, tokenizer_from_config(c), model_id="horizon-tiny", max_len=engine_config(c).max_len,
                   vocab=int(c.model.vocab_size), admin_token="rl-test",
                   load_version=lambda v: WeightReceiver(far / "weights").load(template, v)[0],
                   weights_dir=str(far / "weights"))
    try:
        with serving(app) as url:
            _driver().main(argv + [f"--config.exp.out_dir={far}", "--config.rl.sampler.backend=remote",
                                   f"--config.rl.sampler.base_url={url}/v1"])
    finally:
        svc.close()
    a, b = _records(local), _records(far)
    assert [r["phase"] for r in a] == ["eval", "rl", "rl", "rl", "eval"]
    assert a == b
    assert svc.version == 3 and svc.stats["completed"] > 0                # versions 0..3 were loaded
