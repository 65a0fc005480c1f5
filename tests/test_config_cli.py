"""One config dialect (`horizon.utils.cli`): `--config=FILE --config.a.b=v` is the last word on a
field, and bad input stops in one stderr line with exit code 2 before any directory or container
exists. The override tests drive the real drivers (experiments/rl.py's `main`, rl_async's loop
count) with the expensive parts that are not under test (SFT, the model's sampling, the gradient
step) replaced, so what they check is the path from the command line to the episode and the batch."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from horizon.agent import Generation
from horizon.utils import cli
from horizon.utils.config import ConfigError
from horizon.utils.seeds import KEY_NAMES, run_keys

ROOT = pathlib.Path(__file__).resolve().parents[1]
LOCAL = ["--config.exp.backend=local", "--config.exp.eval.n_tasks=2", "--config.exp.eval.passes=1",
         "--config.exp.plot=false", "--config.exp.steps=1", "--config.rl.optim.warmup_steps=0",
         "--config.rl.memory_check.enabled=false"]     # no real train step here (tests/rl/test_memory.py has it)


def _driver(name: str):
    spec = importlib.util.spec_from_file_location(f"drv_{name}", ROOT / "experiments" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _set_call_policy(tok):
    """A policy that answers every context with the same well-formed `set` call (no model)."""
    call = tok.encode("<function=set><parameter=value>1</parameter><parameter=name>X</parameter></function>")
    toks = np.asarray(list(call) + [tok.END_TURN], np.int32)

    def policy(contexts, max_new_tokens):
        return [Generation(toks[:max_new_tokens], np.full(min(len(toks), max_new_tokens), -1.0, np.float32))
                for _ in contexts]
    # what `engine_policy.rollout_policy`'s policies count and report (`EnginePolicy.usage`)
    policy.state = {"switches": 0, "tokens": 0, "gen_s": 0.0}
    policy.usage = lambda: dict(gen_s=0.0, tool_wait_s=0.0, slot_steps=0, engine_tokens=0)
    return policy


def _run_rl_driver(monkeypatch, tmp_path, extra):
    """experiments/rl.py's main on local sandboxes with SFT, sampling and the gradient step replaced;
    returns (the batches the trainer step received, the episodes' trajectories)."""
    from horizon.data.tokenizer import ByteTokenizer
    from horizon.env import rollouts as env_rollouts
    from horizon.inference import policy as engine_policy
    from horizon.model import transformer
    from horizon.rl.algo import trainer
    from horizon.rl.runtime import warmstart

    drv = _driver("rl")
    tok = ByteTokenizer()
    batches, trajs = [], []
    real_rollout = env_rollouts.rollout_batch

    def rollout(*a, **k):
        out = real_rollout(*a, **k)
        trajs.extend(out[0])
        return out

    def train_step(state, b, cfg):
        batches.append(b)
        return state, {"reward_mean": 0.0, "best_of_k": 0.0, "loss": 0.0}

    monkeypatch.setattr(warmstart, "config_edit_warm_start", lambda c, f, t, o, log, k: transformer.init(k, c.model))
    monkeypatch.setattr(drv, "sft_check", lambda *a: dict(greedy_wellformed=1.0, sampled_wellformed=1.0,
                                                          greedy_correct=0.0, sampled_correct=0.0, greedy_example=""))
    monkeypatch.setattr(engine_policy, "rollout_policy", lambda *a, **k: _set_call_policy(tok))
    monkeypatch.setattr(trainer, "train_step", train_step)
    monkeypatch.setattr(env_rollouts, "rollout_batch", rollout)
    drv.main(["--config=configs/rl_tiny.py", f"--config.exp.out_dir={tmp_path / 'run'}", *LOCAL, *extra])
    return batches, trajs


def test_group_size_override_reaches_the_trainer_batch(monkeypatch, tmp_path):
    batches, _ = _run_rl_driver(monkeypatch, tmp_path, ["--config.rl.group_size=8", "--config.rl.prompts_per_step=2",
                                                        "--config.exp.pool_size=16"])
    assert len(batches) == 1
    b = batches[0]
    groups = np.asarray(b["row_group"])[np.asarray(b["row_chain"]) >= 0]
    assert np.bincount(groups).tolist() == [8, 8]          # 2 prompts x 8 rollouts (the config said 4)


def test_max_turns_override_reaches_the_episode(monkeypatch, tmp_path):
    _, trajs = _run_rl_driver(monkeypatch, tmp_path, ["--config.agent.max_turns=5", "--config.model.max_seq_len=1024",
                                                      "--config.agent.max_context_tokens=1000"])
    train = trajs[-8:]                                      # the RL step's 2 x 4 episodes (evals come before)
    assert {t.stats["turns"] for t in train} == {5} and {t.end_reason for t in train} == {"max_turns"}


def test_exp_steps_override_sets_the_async_step_count(tmp_path):
    """`exp.steps` is every loop's step count, and the RL schedule's (one FieldReference); the toy
    sync loop of experiments/rl_async.py runs exactly that many steps."""
    from horizon.rl.runtime import async_setup, orchestrator, processes
    from horizon.rl.runtime import core as runtime

    drv = _driver("rl_async")
    c = drv.load_config(["--config=configs/rl_async.py", "--config.exp.steps=3", "--config.model.num_layers=2",
                         "--config.model.d_model=32", "--config.rl.group_size=2",
                         "--config.async_.toy_max_new_tokens=8", f"--config.async_.run_dir={tmp_path}"])
    assert int(c.exp.steps) == 3 and int(c.rl.optim.steps) == 3
    c2 = drv.load_config(["--config=configs/rl_async_tiny.py", "--config.rl.prompts_per_step=3",
                          "--config.exp.backend=local"])
    assert runtime.batch_slots(c2) == 3 and async_setup.worker_queue_depth(c2) == 3   # derived after overrides
    processes.run_child(c, processes.sync_main, c, str(tmp_path / "sync"))
    r = orchestrator.summarize_sync(tmp_path / "sync")
    assert r["steps"] == 3 and len(r["rewards"]) == 3


BAD = [
    (["--config.no.such=1"], r"unknown config field --config\.no\.such"),
    (["--config.rl.group_size=abc"], r"config\.rl\.group_size=abc"),
    (["--config.agent.trigger_tokens=999999"], r"agent\.trigger_tokens=999999: must be below agent\.max_context"),
    (["--config=configs/no_such_config.py"], r"config file not found: configs/no_such_config\.py"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=["unknown", "type", "budget", "missing_file"])
def test_bad_input_exits_2_with_one_line_and_leaves_nothing(tmp_path, argv, message):
    """A real subprocess of experiments/rl.py with the Docker backend: one stderr line, exit 2, no run
    directory, no container started (the Docker engine's container list is unchanged)."""
    out = tmp_path / "run"
    before = _containers()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    t0 = time.time()
    p = subprocess.run([sys.executable, str(ROOT / "experiments" / "rl.py"), "--config=configs/rl_tiny.py",
                        f"--config.exp.out_dir={out}", *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=60)
    wall = time.time() - t0
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]), p.stderr
    assert lines[0].startswith("experiments/rl.py: error: ")
    assert not out.exists() and _containers() == before
    assert wall < 10, f"{wall:.1f}s to refuse bad input"


def _containers():
    try:
        import docker

        return sorted(x.id for x in docker.from_env().containers.list(all=True))
    except Exception:  # noqa: BLE001  (no engine: nothing can be started either)
        return []


@pytest.mark.parametrize("driver,argv,message", [
    ("selfsum", ["--config.exp.strategies=('self_summary', 'magic')"], r"exp\.strategies='magic'"),
    ("selfsum", ["--config.exp.steps=1"], r"rl\.optim\.warmup_steps=2: must be < exp\.steps=1"),
    ("eval", ["--config.eval.checkpoints=('rl=/no/such/dir',)"], r"eval\.checkpoints\[rl\]='/no/such/dir'"),
    ("eval", ["--config.eval.checkpoints=('oops',)"], r"must be 'NAME=DIR'"),
    ("eval", ["--config.eval.ledger=runs/x.jsonl"], r"eval\.ledger='runs/x\.jsonl': must be a docs/results/"),
    ("eval", ["--config.eval.ledger=docs/results/x.jsonl"], r"eval\.ledger=.*takes SWE-bench episodes"),
    ("rl_async", ["--config=configs/rl_async.py", "--config.async_.compare=('sync', 'x')"], r"async_\.compare"),
    ("rl_async", ["--config=configs/rl_async.py", "--config.rl.slots_per_batch=3"],
     r"rl\.slots_per_batch=3: must divide rl\.prompts_per_step=2"),
    ("pretrain", ["--config.train.warmup_steps=300"], r"train\.warmup_steps=300: must be < train\.steps=300"),
    ("pretrain", ["--config.mesh.preset=tp8"], r"mesh\.preset='tp8': must be '' or one of"),
    ("pretrain", ["--config.exp.wandb.mode=sometimes"], r"exp\.wandb\.mode='sometimes': must be 'offline'"),
    ("rl", ["--config.exp.text_every=-1"], r"exp\.text_every=-1: must be >= 0"),
    ("rl", ["--config.exp.pool_size=4"], r"exp\.pool_size=4: must hold one generation's rollouts"),
    ("rl", ["--config.mesh.data=3"], r"mesh=.*needs a power-of-two data\*fsdp\*expert \(got 3\)"),
    ("rl", ["--config.mesh.preset=dp8", "--config.rl.batch.min_rows=4"],
     r"rl\.batch\.min_rows=4: must be >= the mesh's 8 data-parallel ranks"),
    ("selfsum", ["--config.mesh.preset=fsdp4xcp2", "--config.exp.sft.seq_len=250"],
     r"exp\.sft\.seq_len=250: must be divisible by 2\*mesh\.context=4"),
    ("rl_async", ["--config=configs/rl_async.py", "--config.mesh.packing=kk"], r"mesh\.packing='kk'"),
    ("eval", ["--config.mesh.preset=tp8"], r"mesh\.preset='tp8': must be '' or one of"),
    ("rl", ["stray"], r"unexpected argument 'stray'"),
    ("rl", ["--config.rl.sampler.engine_slots=0"], r"rl\.sampler\.engine_slots=0: must be in \[1, inf\]"),
    ("rl", ["--config.rl.sampler.engine_max_len=100"],
     r"rl\.sampler\.engine_max_len=100: a slot \(100 positions\) must hold agent\.max_context_tokens=240"),
    ("rl_async", ["--config=configs/rl_async.py", "--config.rl.sampler.engine_refill_slots=99"],
     r"rl\.sampler\.engine_refill_slots=99: must be <= rl\.sampler\.engine_slots=32"),
    ("rl", ["--config.exp.ledger=docs/results/x.jsonl"], r"exp\.arm='': must label the run's arm"),
    ("rl", ["--config.rl.sampler.compute_dtype=fp8"], r"rl\.sampler\.compute_dtype='fp8': must be ''"),
    ("rl", ["--config.exp.env=key_recall"], r"exp\.task: the key_recall family needs the option 'n_logs'"),
    ("rl", ["--config=configs/parallel_calls.py", "--config.agent.max_parallel_calls=0"],
     r"agent\.max_parallel_calls=0: must be in \[1, inf\]"),
    ("rl", ["--config.model.replay_plausibility_score=gates"], r"model\.replay_plausibility_score='gates'"),
    ("rl", ["--config.rl.sampler.engine_window_per_octave=3"],
     r"rl\.sampler\.engine_window_per_octave=3: must be a power of two"),
    ("eval", ["--config.rl.sampler.engine_stop_slots=1"],
     r"rl\.sampler\.engine_stop_slots=1: must hold the tokenizer's 2"),
    ("pretrain", ["--config=configs/pretrain_long.py", "--config.stages.long.rope=ntk"],
     r"stages\.long\.rope='ntk': must be one of"),
    ("pretrain", ["--config=configs/pretrain_long.py", "--config.long_eval.multiples=(1, 4, 32)"],
     r"long_eval\.multiples=\(1, 4, 32\): the longest length"),
])
def test_each_driver_refuses_bad_values_in_one_line(capsys, driver, argv, message):
    """In-process: every driver's `load_config` exits 2 with one line naming the field."""
    drv = _driver(driver)
    with pytest.raises(SystemExit) as e:
        drv.load_config(argv) if hasattr(drv, "load_config") else drv.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(message, err[0]), err


def test_overrides_are_typed_by_the_field_and_tuples_parse():
    c = cli.parse(["--config.rl.optim.lr=3e-4", "--config.exp.plot=false", "--config.exp.task.value_range=(2, 5)",
                   "--config.seed=7"], default="configs/rl_tiny.py")
    assert c.rl.optim.lr == 3e-4 and c.exp.plot is False and tuple(c.exp.task.value_range) == (2, 5) and c.seed == 7
    with pytest.raises(ConfigError, match="unknown config field"):
        cli.parse(["--config.rl.optim.nope=1"], default="configs/rl_tiny.py")
    c = cli.parse(["--config.rl.optim.steps=9"], default="configs/rl_tiny.py")
    assert c.exp.steps == 9                                  # one value, two names (FieldReference)


def test_help_lists_fields_and_exits_0(capsys):
    with pytest.raises(SystemExit) as e:
        _driver("rl").load_config(["--help", "--config.rl.group_size=8"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "usage: experiments/rl.py --config=FILE" in out and "--config.rl.group_size=8" in out


def test_run_keys_are_prefix_stable():
    """Adding a name to KEY_NAMES keeps the earlier keys: selfsum's old split(key, 2) init/RL keys and
    rl.py's split(key, 3) are run_keys' first names."""
    k = run_keys(0)
    base = jax.random.key(0)
    for n in (2, 3):
        for i, ks in enumerate(jax.random.split(base, n)):
            assert np.array_equal(jax.random.key_data(ks), jax.random.key_data(k[KEY_NAMES[i]]))


def test_sweep_cli_refuses_a_bad_override_before_any_run(tmp_path, capsys):
    (tmp_path / "sw.py").write_text("def get_sweep():\n    return [{'train.lr': 1e-3}, {'train.lrr': 1e-3}]\n")
    with pytest.raises(SystemExit) as e:
        _driver("sweep").main([f"--sweep={tmp_path / 'sw.py'}", f"--out={tmp_path / 'out'}"])
    assert e.value.code == 2 and not (tmp_path / "out").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown config field --config.train.lrr" in err[0]
