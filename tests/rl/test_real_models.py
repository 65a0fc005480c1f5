"""Real models in the loop: experiments/rl.py with the repo's BPE tokenizer, and from an HF
checkpoint directory with its tokenizer.json (`model.init_from`), 2 RL steps each in Docker."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import shutil
import warnings

import jax
import numpy as np
import pytest

from horizon.model import hf, transformer
from horizon.utils.config import load_config_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
BPE = ROOT / "envs" / "tokenizers" / "bpe1024.json"
SMALL = ["exp.steps=2", "rl.optim.warmup_steps=0", "exp.sft.clean_steps=2", "exp.sft.steps=2", "exp.sft.log_every=1",
         "exp.sft.optim.warmup_steps=1", "exp.eval.n_tasks=4", "exp.eval.passes=1", "exp.pool_size=4",
         "rl.prompts_per_step=2", "rl.group_size=2", "exp.n_sft_tasks=16", "exp.sft.batch_size=4", "exp.plot=false",
         "agent.max_new_tokens=16",
         "rl.sampler.min_batch_bucket=4", "rl.sampler.min_new_bucket=16", "rl.batch.min_rows=4"]


def _driver():
    spec = importlib.util.spec_from_file_location("rl_driver_real", ROOT / "experiments" / "rl.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _hf_dir(tmp_path, *, tokenizer: pathlib.Path | None) -> pathlib.Path:
    """A tiny horizon model exported as an HF checkpoint directory (+ a tokenizer.json)."""
    c = load_config_file(ROOT / "configs" / "rl_tiny.py")
    c.model.vocab_size = 1024
    d = tmp_path / "hf"
    hf.export_hf_checkpoint(transformer.init(jax.random.PRNGKey(3), c.model), c.model, d)
    if tokenizer is not None:
        shutil.copy(tokenizer, d / "tokenizer.json")
    return d


def test_init_from_adds_missing_chat_specials_and_grows_the_vocabulary(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.train_from_iterator(["def f(x): return x"] * 4, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    plain = tmp_path / "plain.json"
    t.save(str(plain))
    d = _hf_dir(tmp_path, tokenizer=plain)
    c = load_config_file(ROOT / "configs" / "rl_tiny.py")
    c.model.init_from = str(d)
    with pytest.warns(UserWarning, match="added horizon's chat special tokens"):
        hf.apply_init_from(c)
    assert c.model.tokenizer.endswith(hf.CHAT_TOKENIZER_FILE) and c.model.init_from == str(d)
    assert c.model.vocab_size == 1024                              # 300 + 8 specials fit the checkpoint's rows
    c.model.vocab_size = 1030                                      # a tokenizer larger than the checkpoint: rows grow
    p = hf.pretrained_params(c, jax.random.PRNGKey(0))
    ref = hf.load_pretrained(d, base=load_config_file(ROOT / "configs" / "rl_tiny.py").model)[1]
    assert p["embed"].shape == (1030, c.model.d_model) and p["lm_head"].shape == (c.model.d_model, 1030)
    np.testing.assert_array_equal(np.asarray(p["embed"][:1024]), np.asarray(ref["embed"]))
    assert 0 < float(np.std(np.asarray(p["embed"][1024:]))) < 0.1


@pytest.mark.docker
@pytest.mark.parametrize("case", ["bpe_config", "hf_dir"])
def test_rl_driver_two_steps_with_a_real_tokenizer(case, tmp_path):
    from horizon.sandbox import docker_available

    if not docker_available():
        pytest.skip("\n\n*** DOCKER ENGINE NOT AVAILABLE: the real-model RL driver test was SKIPPED ***\n")
    out = tmp_path / "run"
    if case == "bpe_config":
        argv = [f"--config={ROOT / 'configs' / 'rl_tiny_bpe.py'}"]
    else:        # rl_tiny.py names no tokenizer: the checkpoint dir's tokenizer.json (the repo's BPE) is used
        argv = [f"--config={ROOT / 'configs' / 'rl_tiny.py'}",
                f"--config.model.init_from={_hf_dir(tmp_path, tokenizer=BPE)}"]
    argv += [f"--config.exp.out_dir={out}"] + [f"--config.{s}" for s in SMALL]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)                # no chat specials had to be added
        summary = _driver().main(argv)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model"]["vocab_size"] == 1024 and cfg["model"]["tokenizer"].endswith(".json" if case == "bpe_config"
                                                                                      else "hf")
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in recs if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == [1, 2] and summary["steps"] == 2
    assert all(r["groups"] == 2 and r["loss"] == r["loss"] for r in rl)
