"""horizon.rl.runtime.warmstart pieces that need no sandbox: the two-stage warm start and its checkpoints."""

from __future__ import annotations

import pathlib
import shutil
import types

import jax
import ml_collections
import numpy as np
import pytest

from horizon.data.tokenizer import ByteTokenizer, tokenizer_from_config
from horizon.env import swe_demos
from horizon.env.demos import config_edit_demos
from horizon.env.families import family_from_config
from horizon.rl.runtime import checks, warmstart
from horizon.tasks.task import Task
from horizon.utils.config import load_config_file
from horizon.utils.seeds import run_keys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _cfg(**sft):
    c = load_config_file(ROOT / "configs" / "rl_tiny.py")
    c.model.num_layers, c.model.d_model = 2, 32          # small compiles
    c.exp.n_sft_tasks = 16
    c.exp.sft.batch_size = 4
    c.exp.sft.log_every = 1
    c.exp.sft.optim.warmup_steps = 0                     # the stages here are 1-3 steps (warmup < steps)
    for k, v in sft.items():
        c.exp.sft[k] = v
    return c


def _recorded_demos(fam, tok):
    """`two_stage_sft`'s demos callback on 16 config-edit demos, and the `clean` flags it was called with."""
    rows = config_edit_demos(fam.tasks("train", 16), tok, np.random.default_rng(0), corrupt_prob=0.0,
                             value_range=(1, 9), corrupt="next")
    calls = []

    def demos(clean):
        calls.append(clean)
        return rows
    return demos, calls


def test_two_stage_warm_start_writes_both_checkpoints_and_reloads(tmp_path):
    c = _cfg(clean_steps=2, steps=3)
    recs = []
    fam = family_from_config(c.exp)
    p = warmstart.config_edit_warm_start(c, fam, ByteTokenizer(c.model.vocab_size), tmp_path, recs.append,
                                         run_keys(c.seed)["init"])
    # stage sizes come from the config (the clean stage's `steps` override does not leak into stage 2)
    assert [r["step"] for r in recs if r["phase"] == "sft_clean"] == [1, 2]
    assert [r["step"] for r in recs if r["phase"] == "sft"] == [1, 2, 3]
    assert c.exp.sft.steps == 3 and (tmp_path / "sft_clean" / "2").is_dir() and (tmp_path / "sft" / "3").is_dir()
    back = warmstart.load_sft_params(c, tmp_path / "sft")     # what experiments/rl_async.py starts from
    for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(back)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # a rerun restores the finished stage 2 instead of training again
    again = warmstart.config_edit_warm_start(c, fam, ByteTokenizer(c.model.vocab_size), tmp_path, recs.append,
                                             run_keys(c.seed)["init"])
    assert len(recs) == 5
    for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(again)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_two_stage_sft_builds_demos_only_for_missing_stages(tmp_path):
    """Demos can take minutes (selfsum: chains through the agent loop): a stage with a finished
    checkpoint must not build its demos again; clean_steps=0 skips stage 1 entirely."""
    from horizon.model import transformer

    c = _cfg(clean_steps=1, steps=1)
    fam = family_from_config(c.exp)
    tok = ByteTokenizer(c.model.vocab_size)
    demos, calls = _recorded_demos(fam, tok)

    p0 = transformer.init(run_keys(c.seed)["init"], c.model)
    warmstart.two_stage_sft(p0, demos, c, tmp_path, lambda r: None)
    assert calls == [True, False]
    warmstart.two_stage_sft(p0, demos, c, tmp_path, lambda r: None)          # both stages restored
    assert calls == [True, False]
    c.exp.sft.clean_steps = 0
    warmstart.two_stage_sft(p0, demos, c, tmp_path / "one", lambda r: None)
    assert calls == [True, False, False] and not (tmp_path / "one" / "sft_clean").exists()
    c.exp.sft.steps = 3                                                # a changed stage size is not reused silently
    with pytest.raises(ValueError, match="finished 1-step SFT"):
        warmstart.two_stage_sft(p0, demos, c, tmp_path, lambda r: None)


def test_a_family_brings_its_demos_to_the_shared_sft_checkpoint(tmp_path):
    """`warm_start(demos=)` (experiments/rl.py's key-recall families): with `exp.sft.init_from` the shared
    checkpoint is made from those demos where it is missing, then loaded by every later arm unbuilt."""
    c = _cfg(clean_steps=1, steps=1)
    fam = family_from_config(c.exp)
    tok = ByteTokenizer(c.model.vocab_size)
    demos, calls = _recorded_demos(fam, tok)

    c.exp.sft.init_from = str(tmp_path / "shared" / "sft")
    key = run_keys(c.seed)["init"]
    p = warmstart.warm_start(c, fam, tok, tmp_path / "arm0", lambda r: None, key, demos=demos)
    assert calls == [True, False] and (tmp_path / "shared" / "sft" / "1").is_dir()
    q = warmstart.warm_start(c, fam, tok, tmp_path / "arm1", lambda r: None, key, demos=demos)
    assert calls == [True, False] and not (tmp_path / "arm1").exists()
    for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(q)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_run_sft_lr_override_is_local(tmp_path):
    """A stage's `lr` (two_stage_sft's `exp.sft.clean_lr`) sets this call's peak lr only. Adam's first step
    moves every parameter with a gradient by exactly lr (m / sqrt(v) = sign(g); warmup is 0 for a
    1-step run), so the largest change of the lm head is the lr used."""
    from horizon.env.demos import config_edit_demos
    from horizon.model import transformer

    c = _cfg(steps=1)
    tok = ByteTokenizer(c.model.vocab_size)
    rows = config_edit_demos(family_from_config(c.exp).tasks("train", 16), tok, np.random.default_rng(0),
                             corrupt_prob=0.0, value_range=(1, 9), corrupt="next")
    for name, lr in (("low", 3e-4), ("default", None)):
        p0 = transformer.init(run_keys(c.seed)["init"], c.model)
        head0 = np.asarray(p0["lm_head"]).copy()                       # (d_model, vocab)
        p = warmstart.run_sft(p0, rows, c, tmp_path, lambda r: None, stage=warmstart.SFTStage(name=name, lr=lr))
        head = np.asarray(p["lm_head"])
        want = c.exp.sft.optim.lr if lr is None else lr
        np.testing.assert_allclose(np.abs(head - head0).max(), want, rtol=1e-3)
    assert c.exp.sft.optim.lr == 1e-2                                   # the config is not changed


def test_load_sft_params_without_checkpoint_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="no SFT checkpoint"):
        warmstart.load_sft_params(_cfg(), tmp_path / "missing")


def test_selfsum_stage1_curriculum_mixes_chain_lengths():
    """experiments/selfsum.py's stage 1 demos are the union of `exp.sft.clean_mix`'s task sizes
    (short chains with an earlier trigger, ..., the experiment's own) while stage 2 uses the
    experiment's tasks only; a malformed mix element is refused."""
    import copy

    from horizon.studies import selfsum as mod

    c = load_config_file(ROOT / "configs" / "selfsum_tiny.py")
    c.exp.n_sft_tasks, c.exp.demo_sandboxes, c.exp.demo_backend = 2, 2, "local"
    c.exp.sft.clean_mix = ml_collections.ConfigDict(dict(
        b_full={}, a_short=dict(task=dict(n_logs=1, log_lines=1), agent=dict(trigger_tokens=100))))   # name order
    ml_collections.FrozenConfigDict(c)                           # the trainer freezes the whole config
    tok = tokenizer_from_config(c)                                # the study's BPE
    s1 = mod.stage1_configs(c)
    assert [(s.exp.task.n_logs, s.agent.trigger_tokens) for s in s1] == [(1, 100), (3, 200)]
    assert c.exp.task.n_logs == 3 and c.agent.trigger_tokens == 200          # the experiment itself is untouched
    c2 = copy.deepcopy(c)
    c2.exp.strategies = ("self_summary",)
    demos = mod.warm_start_demos(family_from_config(c2.exp), c2, tok)
    mixed, full = demos(True), demos(False)
    reads = [tok.decode(t).count("<function=read>") for t, _ in mixed]    # 2 segments per chain, mix order
    assert max(reads[:4]) == 2 and max(reads[4:]) == 4                     # key + 1 log, then key + 3 logs
    assert max(tok.decode(t).count("<function=read>") for t, _ in full) == 4
    assert len(mixed) == 8 and len(full) == 4                         # stage 2: the full chains only
    c.exp.sft.clean_mix = ml_collections.ConfigDict(dict(short=dict(tasks=dict(n_logs=1))))
    with pytest.raises(ValueError, match="unknown keys"):
        mod.stage1_configs(c)
    with c.exp.sft.ignore_type():
        c.exp.sft.clean_mix = (dict(task=dict(n_logs=1)),)               # the tuple-of-dicts form is refused
    with pytest.raises(ValueError, match="must map names"):
        mod.stage1_configs(c)


def test_run_sft_probe_runs_on_schedule_with_current_params(tmp_path):
    """`probe` (selfsum's key-copy check during SFT) runs every `stage.probe_every` steps and at the
    end, sees the params of that step, and its numbers join the log record."""
    from horizon.env.demos import config_edit_demos
    from horizon.model import transformer

    c = _cfg(steps=3)
    c.exp.sft.log_every = 100
    tok = ByteTokenizer(c.model.vocab_size)
    rows = config_edit_demos(family_from_config(c.exp).tasks("train", 16), tok, np.random.default_rng(0),
                             corrupt_prob=0.0, value_range=(1, 9), corrupt="next")
    seen, recs = [], []

    def probe(params):
        seen.append(np.asarray(params["lm_head"]).copy())
        return {"head_sum": float(np.asarray(params["lm_head"]).sum())}

    p0 = transformer.init(run_keys(c.seed)["init"], c.model)
    head0 = np.asarray(p0["lm_head"]).copy()
    p = warmstart.run_sft(p0, rows, c, tmp_path, recs.append, stage=warmstart.SFTStage(probe_every=2), probe=probe)
    assert [r["step"] for r in recs] == [2, 3] and len(seen) == 2       # step 2, then the end (step 3)
    np.testing.assert_array_equal(seen[-1], np.asarray(p["lm_head"]))
    assert not np.array_equal(seen[0], head0) and not np.array_equal(seen[0], seen[1])
    assert recs[-1]["head_sum"] == pytest.approx(float(np.asarray(p["lm_head"]).sum()))


@pytest.mark.parametrize("sft_remat,model_remat,want", [(None, True, True), (False, True, False), (True, False, True)])
def test_sft_remat_overrides_the_model_remat_for_sft_only(monkeypatch, tmp_path, sft_remat, model_remat, want):
    """`exp.sft.remat` (when set) is the recompute SFT's LM step is built with; `model.remat` (the RL
    trainer's) is left as it was."""
    from horizon.model import transformer
    from horizon.train import lm

    c = load_config_file(ROOT / "configs" / "rl_tiny.py")
    c.model.remat = model_remat
    if sft_remat is not None:
        c.exp.sft.remat = sft_remat
    seen = []

    def stop(sc, mesh, shapes):
        seen.append(bool(sc.model.remat))
        raise RuntimeError("built")

    monkeypatch.setattr(lm, "make_train_step", stop)
    params = transformer.init(jax.random.PRNGKey(0), c.model)
    with pytest.raises(RuntimeError, match="built"):
        warmstart.run_sft(params, [], c, tmp_path, lambda r: None)
    assert seen == [want] and bool(c.model.remat) == model_remat


def test_the_swe_probe_needs_its_instances(tmp_path):
    """configs/swe_real.py's SFT probe reads the demonstrations of `exp.sft.probe_path`'s instances: a
    missing file is refused before any sandbox starts; probe_every=0 does not read it."""
    c = ml_collections.ConfigDict(load_config_file(ROOT / "configs" / "swe_real.py").to_dict())
    c.exp.sft.probe_path = str(tmp_path / "none.jsonl")
    with pytest.raises(checks.ConfigError, match=r"exp\.sft\.probe_path='.*none\.jsonl': no such file"):
        checks.validate_sft(c)
    (tmp_path / "none.jsonl").write_text("")
    checks.validate_sft(c)
    c.exp.sft.probe_turns = 0
    with pytest.raises(checks.ConfigError, match=r"exp\.sft\.probe_turns=0"):
        checks.validate_sft(c)
    c.exp.sft.probe_every = 0
    checks.validate_sft(c)


def test_swebench_warm_start_builds_its_demos_once(tmp_path, monkeypatch):
    """Real-repository demonstrations take minutes in Docker: the warm start saves them
    (out/demos.npz) and a rerun that must train again (here: its checkpoint removed) reads them
    back instead of starting sandboxes; another agent setting builds them again."""
    c = _cfg(clean_steps=0, steps=1)
    c.exp.n_sft_tasks = 2
    tasks = [Task(id=f"t{i}", prompt=f"fix {i}", files={}, test_cmd="true", image="img",
                  metadata={"patch": "", "fail_to_pass": []}) for i in range(2)]
    fam = types.SimpleNamespace(tasks=lambda split, n: tasks[:n])
    rows = [(np.arange(1, 60) % 200, np.r_[np.zeros(30), np.ones(29)].astype(np.float32)) for _ in range(40)]
    built, opened = [], []

    def fake_demos(family, ts, pool, c_, tok):
        built.append([t.id for t in ts])
        return rows, swe_demos.DemoReport(tried=len(ts), kept=len(ts), rows=len(rows))
    monkeypatch.setattr(swe_demos, "swebench_demos", fake_demos)
    monkeypatch.setattr(warmstart.SandboxPool, "from_config",
                        lambda c_: opened.append(1) or types.SimpleNamespace(close=lambda: None))
    tok, key = ByteTokenizer(c.model.vocab_size), run_keys(c.seed)["init"]
    recs = []
    first = warmstart.swebench_warm_start(c, fam, tok, tmp_path, recs.append, key)
    assert built == [["t0", "t1"]] and opened == [1] and (tmp_path / "demos.npz").is_file()
    assert [r["demos/kept"] for r in recs if r["phase"] == "demos"] == [2]
    shutil.rmtree(tmp_path / "sft")
    again = warmstart.swebench_warm_start(c, fam, tok, tmp_path, recs.append, key)
    assert built == [["t0", "t1"]] and opened == [1]                  # read back: no sandbox, no rebuild
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(again)):   # the same rows train the same params
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    c.agent.max_turns += 1
    shutil.rmtree(tmp_path / "sft")
    warmstart.swebench_warm_start(c, fam, tok, tmp_path, recs.append, key)
    assert len(built) == 2
