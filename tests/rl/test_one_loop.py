"""One RL loop (docs/SPEC.md §4, §4.1): the synchronous loop (`loop.run_rl`) and the asynchronous runtime
at `max_staleness = 0` are shells over the same three pieces (`horizon.rl.runtime.core`), so with the
same config, seed and XLA flags, and float32 weight publishing, they train on identical groups and
reach identical params."""

import json
import pathlib

import numpy as np
import pytest

from horizon.rl.runtime import async_setup, orchestrator, processes, storage
from horizon.rl.runtime import core as runtime
from horizon.train.checkpoint import restore_params
from horizon.utils.config import load_config_file

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _cfg(steps: int):
    c = load_config_file(ROOT / "configs" / "rl_async.py")       # the toy env: no sandbox
    c.model.num_layers, c.model.d_model = 2, 32                   # 1 dense + 1 MoE layer: small compiles
    c.rl.group_size, c.rl.prompts_per_step = 2, 2
    c.rl.slots_per_batch = 1              # two generation batches per step: batching must not depend on timing
    c.async_.toy_max_new_tokens = 16
    c.async_.max_staleness = 0
    c.async_.publish_dtype = "float32"    # the workers sample with exactly the trainer's params
    c.async_.queue_depth = 2              # both batches of a step are queued at once
    c.exp.steps = steps
    c.exp.compilation_cache_dir = str(ROOT / "runs" / "jax_cache")
    return c


def _assert_same_groups(a: storage.GroupRecord, b: storage.GroupRecord) -> None:
    assert (a.slot, a.prompt_id, a.rewards, a.advantages) == (b.slot, b.prompt_id, b.rewards, b.advantages)
    assert (a.min_version, a.max_version) == (b.min_version, b.max_version)
    for ta, tb in zip(a.trajectories, b.trajectories, strict=True):
        assert ta.end_reason == tb.end_reason
        for sa, sb in zip(ta.segments, tb.segments, strict=True):
            for f in ("tokens", "loss_mask", "logprobs", "policy_versions", "router_indices"):
                np.testing.assert_array_equal(getattr(sa, f), getattr(sb, f), err_msg=f"slot {a.slot} {f}")


def _run_both(tmp_path, steps, **wandb):
    c = _cfg(steps)
    c.exp.wandb.update(wandb)
    processes.run_child(c, processes.sync_main, c, str(tmp_path / "sync"))
    res = orchestrator.Orchestrator(c, tmp_path / "async", num_steps=steps).run()
    return c, res


def _check(c, tmp_path, steps):
    sync, asyn = storage.GroupStore(tmp_path / "sync" / "groups"), storage.GroupStore(tmp_path / "async" / "groups")
    n = steps * int(c.rl.prompts_per_step)
    assert sync.ready_slots() == asyn.ready_slots() == list(range(n))
    for s in range(n):
        _assert_same_groups(sync.get(s), asyn.get(s))
        assert sync.get(s).max_version == s // int(c.rl.prompts_per_step)    # version t samples step t
    ps, ms = restore_params(tmp_path / "sync" / "ckpt", c.model)
    pa, ma = restore_params(tmp_path / "async" / "ckpt", c.model)
    assert int(ms["step"]) == int(ma["step"]) == steps
    import jax

    for x, y in zip(jax.tree.leaves(ps), jax.tree.leaves(pa), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # the runs learned something: the params moved from the init
    p0 = async_setup.initial_params(c)
    assert any(np.abs(np.asarray(x) - np.asarray(y)).max() > 0 for x, y in zip(jax.tree.leaves(p0),
                                                                             jax.tree.leaves(ps)))


def test_sync_loop_equals_async_runtime_at_staleness_0(tmp_path, wandb_runs, tensorboard_equals_jsonl):
    steps = 3
    c, res = _run_both(tmp_path, steps, project="horizon-test")      # W&B offline: a local run directory
    assert res["trainer_restarts"] == 0
    _check(c, tmp_path, steps)
    # both loops' logs reach TensorBoard and W&B (horizon.utils.tracking) exactly as in their JSONL
    assert tensorboard_equals_jsonl(tmp_path / "sync") > 0
    assert tensorboard_equals_jsonl(tmp_path / "async", "trainer.jsonl", keep=lambda r: r["event"] == "step") > 0
    for run, phase, jsonl in (("sync", "rl", "metrics.jsonl"), ("async", "trainer", "trainer.jsonl")):
        (name, _, rows), = wandb_runs(tmp_path / run)
        assert name == run
        want = [r["reward_mean"] for r in map(json.loads, (tmp_path / run / jsonl).read_text().splitlines())
                if r.get("phase") == phase]
        assert [r[f"{phase}/reward_mean"] for r in rows if f"{phase}/reward_mean" in r] == want and len(want) == steps
        hist = [r for r in rows if f"{phase}/staleness/_type" in r]
        assert len(hist) == steps                                        # a token-staleness histogram per step
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "sync"))
    acc.Reload()
    assert {"rl/rewards", "rl/advantages", "rl/staleness"} <= set(acc.Tags()["histograms"])
    text = [t for t in acc.Tags()["tensors"] if t.startswith("rl/transcript")]
    assert text and "prompt " in acc.Tensors(text[0])[0].tensor_proto.string_val[0].decode()   # step 1's rollout


def test_prompt_schedule_feeds_stats_before_the_steps_that_need_them():
    c = _cfg(4)
    c.rl.hard_prompt_start_step, c.rl.hard_prompt_weight = 1, 2.0
    sch = runtime.PromptSchedule(c, 4, lag=1)
    assert [r["slot"] for r in sch.assign(0)] == [0, 1] and sch.assign(1)[0]["seed"] == 2
    assert [[r["slot"] for r in b] for b in sch.batches(1)] == [[2], [3]]
    with pytest.raises(RuntimeError, match="not fed"):
        sch.assign(2)                         # lag 1: step 0's stats first
    with pytest.raises(RuntimeError, match="step order"):
        sch.feed(1, [])
    back = runtime.PromptSchedule(c, 4, lag=1).load_state_dict(sch.state_dict())
    assert back.requests == sch.requests and back.sampler.state_dict() == sch.sampler.state_dict()
    c.rl.slots_per_batch = 2
    with pytest.raises(ValueError, match="prompts per step in batches"):
        runtime.PromptSchedule(c, 4, lag=1).load_state_dict(sch.state_dict())


@pytest.mark.slow   # ~3 min: 8 steps, 2 workers
def test_sync_loop_equals_async_runtime_with_two_workers_for_8_steps(tmp_path):
    steps = 8
    c = _cfg(steps)
    c.async_.num_rollout_workers = 2
    processes.run_child(c, processes.sync_main, c, str(tmp_path / "sync"))
    orchestrator.Orchestrator(c, tmp_path / "async", num_steps=steps).run()
    _check(c, tmp_path, steps)
