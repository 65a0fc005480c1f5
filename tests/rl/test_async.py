"""Asynchronous RL (docs/SPEC.md §4, §4.1): in-flight weight switches with per-token versions, staleness
admission control, group store, and a trainer SIGKILL + restart that regenerates nothing and
reproduces the uninterrupted run bit for bit."""

import functools
import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from horizon.data.tokenizer import ByteTokenizer
from horizon.inference import policy as engine_policy
from horizon.inference import sampler
from horizon.model import transformer
from horizon.model.params import numpy_init
from horizon.rl.algo import trainer
from horizon.rl.runtime import async_setup, checks, orchestrator, pools, storage, workers
from horizon.rl.runtime import core as runtime
from horizon.rl.runtime import weight_sync as ws
from horizon.utils.config import load_config_file

TOK = ByteTokenizer()
ROOT = pathlib.Path(__file__).resolve().parents[2]


def small_cfg(**async_overrides):
    c = load_config_file(ROOT / "configs" / "rl_async.py")
    c.model.num_layers = 2          # 1 dense + 1 MoE layer: small compiles
    c.model.d_model = 32
    c.rl.group_size = 2
    c.async_.toy_max_new_tokens = 16
    c.exp.compilation_cache_dir = str(ROOT / "runs" / "jax_cache")
    for k, v in async_overrides.items():
        c.async_[k] = v
    return c


# ----------------------------------------------------------------------------- (a) in-flight updates
@pytest.fixture(scope="module")
def inflight_env():
    c = small_cfg()
    async_setup.setup_jax(c)        # persistent XLA cache: later runs skip most compiles
    cfg = ml_collections.FrozenConfigDict(c)
    p0 = numpy_init(cfg.model, 0)
    rng = np.random.default_rng(1)
    # a clearly different policy: the test must be able to tell which weights sampled a token
    p1 = jax.tree.map(lambda x: x + jnp.asarray(rng.normal(0, 0.05, x.shape), x.dtype), p0)
    fwd = jax.jit(functools.partial(transformer.forward, cfg=cfg.model))
    return cfg, p0, p1, fwd


def switching_poll(p0, p1, after_calls):
    """poll() that serves version 0, then version 1 from call `after_calls` on (a publish mid-rollout)."""
    n = {"calls": 0}

    def poll():
        n["calls"] += 1
        return (p0, 0) if n["calls"] <= after_calls else (p1, 1)
    return poll


def trainer_logprobs(fwd, params, prompt, gen):
    toks = jnp.asarray(np.concatenate([prompt, gen])[None], jnp.int32)
    logits, _ = fwd(params, toks)
    lp, _ = trainer.token_logprobs(logits, toks)   # the trainer's own recomputation
    return np.asarray(lp[0, len(prompt):])


@pytest.mark.parametrize("kv_mode", ["recompute", "keep"])
def test_rollout_spanning_a_weight_update(inflight_env, kv_mode):
    cfg, p0, p1, fwd = inflight_env
    prompt = workers.toy_prompt("toy_0", TOK)
    chunk, n_new = 4, 12
    # two rows and the config's buckets: the same compiled shapes as the toy rollout below
    sc = sampler.sampler_config(cfg, min_batch_bucket=2, chunk_tokens=chunk, kv_mode=kv_mode, stop_tokens=())
    out = sampler.generate(None, [prompt, prompt], jax.random.key(0), cfg=cfg, poll=switching_poll(p0, p1, 1),
                           max_new_tokens=n_new, sampling=sc)
    v, gen, lp = out.versions[0], out.tokens[0], out.logprobs[0]
    assert out.switches == 1 and len(gen) == n_new
    # recompute: the pending token is re-sampled by the new weights; keep: it stays old-version
    n_old = chunk if kv_mode == "recompute" else chunk + 1
    np.testing.assert_array_equal(v, [0] * n_old + [1] * (n_new - n_old))
    lp0 = trainer_logprobs(fwd, p0, prompt, gen)
    lp1 = trainer_logprobs(fwd, p1, prompt, gen)
    # tokens sampled by version 0 carry version 0's logprob (KV-cache decode vs full forward: f32
    # reduction order differs, 1e-4 covers it; the two policies differ by >> 0.01 per token)
    np.testing.assert_allclose(lp[:n_old], lp0[:n_old], atol=1e-4)
    assert np.abs(lp1[:n_old] - lp[:n_old]).max() > 1e-2
    if kv_mode == "recompute":   # exactly the new policy's samples after the switch
        np.testing.assert_allclose(lp[n_old:], lp1[n_old:], atol=1e-4)
    else:                        # new weights over an old-weight KV prefix: close to neither exactly
        assert np.abs(lp[n_old:] - lp0[n_old:]).max() > 1e-2


@pytest.mark.parametrize("kv_mode", ["recompute", "keep"])
def test_polling_without_a_switch_is_fixed_params_generate(inflight_env, kv_mode):
    """One generate: polling weights that never change gives exactly the fixed-params samples
    (same keys, same compiled steps), with every token tagged by the polled version."""
    cfg, p0, _, _ = inflight_env
    prompts = [workers.toy_prompt("toy_0", TOK), workers.toy_prompt("toy_12", TOK)]
    sc = sampler.sampler_config(cfg, min_batch_bucket=2)
    polled_sc = sampler.sampler_config(cfg, min_batch_bucket=2, chunk_tokens=4, kv_mode=kv_mode)
    fixed = sampler.generate(p0, prompts, jax.random.key(5), cfg=cfg, max_new_tokens=12, sampling=sc, version=3)
    polled = sampler.generate(None, prompts, jax.random.key(5), cfg=cfg, max_new_tokens=12, poll=lambda: (p0, 3),
                              sampling=polled_sc)
    assert polled.switches == 0
    for a, b in zip(fixed.tokens + fixed.logprobs + fixed.versions, polled.tokens + polled.logprobs + polled.versions):
        np.testing.assert_array_equal(a, b)
    assert all((v == 3).all() for v in polled.versions)
    for a, b in zip(fixed.router_indices, polled.router_indices):
        np.testing.assert_array_equal(a, b)


def test_toy_rollout_tags_tokens_and_builds_a_batch(inflight_env):
    cfg, p0, p1, _ = inflight_env
    from horizon.data.tokenizer import ByteTokenizer
    from horizon.rl.algo import batch as rlbatch

    # the engine polls once when built and at every round-trip (<= 4 decode steps): version 1 from its second
    pol = engine_policy.rollout_policy(switching_poll(p0, p1, 2), cfg, jax.random.key(3), chunk_tokens=4)
    trajs, rs, _ = workers.toy_rollout(dict(prompt_id="toy_1", slot=0, seed=0), pol, cfg, ByteTokenizer())
    b = rlbatch.build_batch_from_config([trajs], np.asarray([rs], np.float32), cfg)
    vers = b["policy_versions"][b["loss_mask"]]
    assert set(np.unique(vers)) == {0, 1}            # one group spans the update
    assert (b["policy_versions"][~b["loss_mask"]] == -1).all()
    assert storage.group_versions(trajs) == (0, 1)


def test_experiment_env_batches_slots_of_rl_py_task(inflight_env):
    """env="experiment" (configs/rl_async_tiny.py): rl.py's config-edit prompts, several slots in one
    generation, per-slot groups tagged with the version that sampled them (local sandboxes here;
    the Docker run is experiments/rl_async.py)."""
    from horizon.data.tokenizer import ByteTokenizer
    from horizon.env.families import family_from_config

    _, p0, _, _ = inflight_env
    c = load_config_file(ROOT / "configs" / "rl_async_tiny.py")
    c.model.num_layers, c.model.d_model = 2, 32          # p0's shapes
    c.rl.group_size, c.exp.pool_size, c.exp.backend = 2, 4, "local"
    c.rl.slots_per_batch = 2
    checks.validate_async(c)
    ids = runtime.prompt_ids(c, 2)
    fam = family_from_config(c.exp)
    assert ids == [workers.experiment_prompt_id("config_edit", s) for s in fam.seeds("train", 2, c.exp.n_sft_tasks)]
    pol = engine_policy.rollout_policy(lambda: (p0, 7), c, jax.random.key(0), chunk_tokens=16)
    env = workers.ENVS["experiment"](c)
    try:
        res = env.rollouts([dict(slot=i, prompt_id=x, seed=i) for i, x in enumerate(ids)], pol, ByteTokenizer())
    finally:
        env.close()
    assert len(res) == 2 and all(len(tr) == 2 and len(rs) == 2 for tr, rs, _ in res)
    for (trajs, _, infos), pid in zip(res, ids):
        assert {t.task_id for t in trajs} == {fam.make_task(workers.experiment_seed(pid)).id}
        assert storage.group_versions(trajs) == (7, 7)
        assert all(i["verifier"] in (0.0, 1.0) for i in infos)
    c.exp.pool_size = 3                                   # cannot hold one batch's rollouts
    with pytest.raises(ValueError, match="pool_size"):
        checks.validate_async(c)


# ----------------------------------------------------------------------------- scheduler + stores (no JAX)
def test_staleness_admission_control():
    s = orchestrator.StalenessScheduler(groups_per_step=2, max_staleness=1)
    assert not s.can_admit(0, None)                          # no weights yet
    assert [x for x in range(10) if s.can_admit(x, 0)] == [0, 1, 2, 3]   # steps 0, 1 while v=0
    assert s.capacity(0) == 4 and s.capacity(3) == 10
    sync = orchestrator.StalenessScheduler(groups_per_step=2, max_staleness=0)
    assert [x for x in range(10) if sync.can_admit(x, 2)] == [0, 1, 2, 3, 4, 5]  # only up to step 2's
    with pytest.raises(ValueError):
        orchestrator.StalenessScheduler(2, -1)


def test_group_store_writes_once_and_scheduler_state_roundtrip(tmp_path):
    st = storage.GroupStore(tmp_path / "g")
    rec = storage.GroupRecord(slot=3, prompt_id="p", trajectories=[], rewards=[1.0], advantages=[0.0],
                              min_version=0, max_version=1, start_version=0, generated_tokens=0, worker="w0",
                              seconds=0.1)
    assert st.put(rec) and not st.put(rec)
    assert st.ready_slots() == [3] and st.get(3).max_version == 1
    ss = storage.SchedulerState(tmp_path / "s.json")
    ss.schedule = {"requests": {"0": [dict(slot=0, prompt_id="p", seed=0)]}}
    ss.save()
    back = storage.SchedulerState.load(tmp_path / "s.json")
    assert back.schedule == ss.schedule


# ----------------------------------------------------------------------------- (b) kill + restart
def test_a_killed_rollout_worker_is_replaced_and_its_batches_requested_again(tmp_path):
    """Ray pool, 2 workers, worker 0 killed once version 1 is out: the run finishes, every step trains
    exactly `prompts_per_step` groups, each slot's group is written exactly once. Groups and weights
    go through a storage URL (`async_.storage_url`, file:// here), not the run directory."""
    c = small_cfg(max_staleness=1, num_rollout_workers=2, publish_dtype="float32", poll_s=0.02,
                  storage_url=f"file://{tmp_path}/bucket")
    steps = 3
    run = tmp_path / "run"
    res = orchestrator.Orchestrator(c, run, num_steps=steps, kill_worker_at=1).run()
    assert not (run / "groups").exists() and ws.latest_version(tmp_path / "bucket" / "run" / "weights") == steps
    assert storage.GroupStore(tmp_path / "bucket" / "run" / "groups").ready_slots() == list(range(steps * 2))
    assert res["worker_restarts"] >= 1
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    assert any(e.get("kind") == "worker_killed" for e in events)
    lost = [s for e in events if e.get("kind") == "worker_restart" for s in e["lost_slots"]]
    assert lost                                                # it died holding a batch
    wrote = sorted(e["slot"] for e in events if e.get("kind") == "grouped" and e["wrote"])
    assert wrote == list(range(steps * 2))                     # no slot written twice, none missing
    steps_log = [r for r in orchestrator.read_trainer_log(run) if r["event"] == "step"]
    assert [len(r["slots"]) for r in steps_log] == [2] * steps


def train_only(c, run, steps: int, timeout_s: float = 600) -> None:
    """Run just the trainer (group) of `c` on the groups already in `run`, to completion."""
    pool = orchestrator.make_pool("ray", c)
    try:
        pool.start_trainer(c, str(run), steps)
        assert pool.wait_trainer(timeout_s) == 0
    finally:
        pool.close()


def _weights_sha(run, v):
    return ws.read_entry(pathlib.Path(run) / "weights", v)["sha256_params"]


@pytest.mark.parametrize("steps,kill_at", [(3, 1), pytest.param(4, 2, marks=pytest.mark.slow)])
def test_trainer_sigkill_restart_resumes_groups_bit_identically(tmp_path, steps, kill_at):
    """The trainer actor is killed once version `kill_at` is out; its replacement resumes from the
    checkpoint and reaches, version by version, the weights of an uninterrupted trainer on the same
    groups (sha256 of the published f32 params). The default case is the cheapest one that restores."""
    c = small_cfg(max_staleness=1, num_rollout_workers=1, publish_dtype="float32", full_every=3,
                  poll_s=0.02)
    run = tmp_path / "run"
    orch = orchestrator.Orchestrator(c, run, num_steps=steps, kill_trainer_at=kill_at)
    res = orch.run()
    assert res["trainer_restarts"] == 1
    log = orchestrator.read_trainer_log(run)
    starts = [r for r in log if r["event"] == "start"]
    assert len(starts) == 2 and starts[1]["restored"] and starts[1]["step"] >= kill_at
    assert starts[0]["pid"] != starts[1]["pid"]
    # no finished group regenerated: every slot was produced and written exactly once
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    grouped = [e["slot"] for e in events if e.get("kind") == "grouped"]
    assert sorted(grouped) == list(range(steps * 2)) and all(e["wrote"] for e in events if e.get("kind") == "grouped")
    assert any(e.get("kind") == "trainer_killed" for e in events)
    # staleness bound held for every trained token
    hist = orchestrator.summarize(run)["staleness_hist"]
    assert hist and max(hist) <= 1 and min(hist) >= 0
    # an uninterrupted trainer on the same groups reaches bit-identical weights
    ref = tmp_path / "ref"
    ref.mkdir()
    shutil.copytree(run / "groups", ref / "groups")
    train_only(c, ref, steps)
    for v in range(steps + 1):
        assert _weights_sha(run, v) == _weights_sha(ref, v), f"version {v} differs"
    assert len([r for r in orchestrator.read_trainer_log(ref) if r["event"] == "start"]) == 1


def test_placement_and_engine_specs_parse_or_fail_in_one_line():
    assert pools.parse_resources("trainer=1, rollout=0.5") == {"trainer": 1.0, "rollout": 0.5}
    assert pools.parse_resources("") == {}
    with pytest.raises(ValueError, match="expected 'name=amount"):
        pools.parse_resources("trainer")
    spec = "10.0.0.5=tcp://10.0.0.5:2375,*=unix:///var/run/docker.sock"
    assert pools.docker_host_for(spec, "10.0.0.5") == "tcp://10.0.0.5:2375"
    assert pools.docker_host_for(spec, "10.0.0.6") == "unix:///var/run/docker.sock"
    assert pools.docker_host_for("", "10.0.0.6") is None
    with pytest.raises(ValueError, match="expected 'IP=URL"):
        pools.docker_host_for("10.0.0.5=nohost", "10.0.0.5")


def test_trainer_step_record_splits_the_groups_sandbox_time():
    """The async trainer's step record carries the sync loop's sandbox split, summed over its groups."""
    from horizon.rl.runtime.processes import _step_record

    def rec(slot, tool_s):
        info = dict(reward=1.0, sandbox_prepare_s=0.5, sandbox_reset_s=0.0, sandbox_tool_s=tool_s,
                    sandbox_verify_s=0.25, sandbox_actions=3)
        return storage.GroupRecord(slot, f"p{slot}", [], [1.0], [0.0], 0, 0, 0, 4, "w0", 1.0, infos=[info, info])
    r = _step_record(0, [0, 1], [rec(0, 1.0), rec(1, 2.0)], dict(reward_mean=1.0, loss=0.0), [], wait_s=0.0,
                     train_s=0.0)
    assert r["sandbox/tool_s"] == 6.0 and r["sandbox/prepare_s"] == 2.0 and r["sandbox/actions"] == 12
    assert r["sandbox_s"] == 2.0 + 0.0 + 6.0 + 1.0
