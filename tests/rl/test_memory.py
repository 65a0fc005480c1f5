"""Pre-run memory check of the RL trainer step (`horizon.rl.runtime.memory`): the largest batch
a run can produce, XLA's memory of the step compiled for it from abstract shapes, and the one-line
error experiments/rl.py stops with before any sandbox, warm start or eval."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

from horizon.rl.runtime import memory
from horizon.utils.config import ConfigError, load_config_file

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _config(name: str):
    return load_config_file(str(ROOT / "configs" / name))


def _small(c):
    """rl_tiny's batch with a one-layer dense model and no KL reference: its step compiles in ~6 s
    (the full model's takes ~30 s on 2 cores; that one is `test_full_rl_tiny_fits`, slow)."""
    c.model.num_layers, c.model.first_k_dense, c.rl.kl_coef = 1, 1, 0.0
    return c


@pytest.fixture(scope="module")
def tiny_mem():
    """The step memory of rl_tiny's largest batch on `_small`'s model (the one compile of the default suite)."""
    return memory.step_memory(_small(_config("rl_tiny.py")))


def test_largest_batch_of_a_run():
    c = _config("rl_tiny.py")          # 8 prompts x 4 rollouts, one segment each, 240-token context
    assert memory.max_step_shape(c) == memory.StepShape(rows=32, seq=256, groups=8)
    sw = _config("rl_swegen.py")       # 2 x 4 chains of <= 4000 tokens, in micro-batches
    s = memory.max_step_shape(sw)
    micro = int(sw.rl.batch.micro_rows)
    assert s.seq == 4096 and s.micro_rows == micro and s.microbatches == -(-8 // micro)
    c.agent.context_strategy, c.agent.max_turns = "self_summary", 3     # a summary per turn but the last
    assert memory.max_segments_per_chain(c) == 3
    assert memory.max_step_shape(c).rows == 128                          # bucket(32 chains x 3 segments)
    c.rl.batch.micro_rows = 8
    assert memory.max_step_shape(c).microbatches == 16                   # 2 whole chains per micro-batch
    c.rl.batch.micro_rows = 2
    with pytest.raises(ConfigError, match="rl.batch.micro_rows=2"):
        memory.max_step_shape(c)


def test_check_passes_for_rl_tiny_and_fails_in_one_line_past_the_budget(tiny_mem):
    c = _small(_config("rl_tiny.py"))
    assert tiny_mem.shape == memory.max_step_shape(c) and tiny_mem.temp > 0 and tiny_mem.needed >= tiny_mem.temp
    memory.verdict(tiny_mem, c, memory.available_bytes(c))               # fits this machine
    c.rl.memory_check.budget_gib = 1e-6                                  # an absurd budget
    with pytest.raises(ConfigError) as e:
        memory.verdict(tiny_mem, c, memory.available_bytes(c))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("the RL train step needs ")
    assert "32 x 256 tokens" in msg and "rl.batch.micro_rows > 0" in msg and "model.remat=True" in msg
    assert "rl.memory_check.enabled=False" in msg


def test_rl_driver_stops_before_sandboxes_and_warm_start(monkeypatch, tmp_path, capsys, tiny_mem):
    """experiments/rl.py: exit 2 with the one line before any sandbox pool or warm start exists;
    with room, the run goes on to them."""
    from horizon.rl.runtime import warmstart, workers

    spec = importlib.util.spec_from_file_location("drv_rl_memory", ROOT / "experiments" / "rl.py")
    drv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(drv)
    seen = []
    monkeypatch.setattr(memory, "step_memory", lambda c, shape=None: seen.append(c) or tiny_mem)

    class Reached(Exception):
        pass

    def expensive(*a, **k):
        raise Reached

    monkeypatch.setattr(workers, "family_env", expensive)
    monkeypatch.setattr(warmstart, "warm_start", expensive)
    argv = ["--config=configs/rl_tiny.py", "--config.exp.backend=local", f"--config.exp.out_dir={tmp_path / 'run'}",
            "--config.exp.compilation_cache_dir="]
    with pytest.raises(SystemExit) as e:
        drv.main(argv + ["--config.rl.memory_check.budget_gib=0.000001"])
    assert e.value.code == 2 and len(seen) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("experiments/rl.py: error: the RL train step needs ")
    with pytest.raises(Reached):
        drv.main(argv)
    assert len(seen) == 2
    with pytest.raises(Reached):           # off: not measured at all
        drv.main(argv + ["--config.rl.memory_check.enabled=false"])
    assert len(seen) == 2


@pytest.mark.slow
def test_full_rl_tiny_fits():
    """`check_step_memory` on rl_tiny as `make run` has it (MoE, router replay, KL reference)."""
    mem = memory.check_step_memory(_config("rl_tiny.py"))
    assert mem is not None and mem.shape == memory.StepShape(32, 256, 8) and 0 < mem.needed < 4 * memory.GIB


def test_memory_check_fields_are_validated():
    from horizon.rl.runtime.checks import validate_rl

    c = _config("rl_tiny.py")
    steps = int(c.exp.steps)
    validate_rl(c, steps)
    for field, bad in (("fraction", 0.0), ("fraction", 1.5), ("budget_gib", -1.0)):
        c2 = _config("rl_tiny.py")
        c2.rl.memory_check[field] = bad
        with pytest.raises(ConfigError, match=f"rl.memory_check.{field}="):
            validate_rl(c2, steps)


def test_compiled_executables_released_only_past_the_mapping_share(capsys):
    """Between a study's runs: above `rl.memory_check.mappings_fraction` of vm.max_map_count the jit caches
    are dropped (a cached executable is gone), below it nothing happens; an out-of-range share is refused."""
    import jax
    import jax.numpy as jnp

    held, limit = memory.memory_mappings()          # Linux: this process's mappings and the kernel's limit
    assert 0 < held < limit
    c = load_config_file(ROOT / "configs" / "rl_tiny.py")
    f = jax.jit(lambda x: x * 2 + 1)
    f(jnp.ones(3))
    c.rl.memory_check.mappings_fraction = 1.0
    assert not memory.release_compiled_if_near_limit(c) and f._cache_size() == 1
    c.rl.memory_check.mappings_fraction = 0.0
    assert memory.release_compiled_if_near_limit(c, tag="t: ") and f._cache_size() == 0
    assert "t: " in capsys.readouterr().out
    from horizon.rl.runtime import checks
    c.rl.memory_check.mappings_fraction = 1.5
    with pytest.raises(ConfigError, match="mappings_fraction"):
        checks.validate_experiment(c, None)
