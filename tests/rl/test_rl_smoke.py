"""End-to-end smoke test of experiments/rl.py in Docker: SFT -> eval -> RL step -> eval (docs/SPEC.md §4).

Tiny settings (2 SFT steps, 1 RL step of 2 prompts x 4 rollouts, 4 held-out tasks x 2 passes,
16-token generations, small compile buckets). The run is dominated by jit compiles (SFT step,
sampler prefill/step, RL step); the persistent compilation cache (`c.exp.compilation_cache_dir`)
makes reruns faster.
"""

import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _driver():
    spec = importlib.util.spec_from_file_location("rl_driver", ROOT / "experiments" / "rl.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.docker
@pytest.mark.slow
def test_rl_driver_end_to_end(tmp_path):
    from horizon.sandbox import docker_available

    if not docker_available():
        pytest.skip("\n\n*** DOCKER ENGINE NOT AVAILABLE: the RL driver smoke test was SKIPPED ***\n")
    out = tmp_path / "run"
    sets = ["exp.steps=1", "rl.optim.warmup_steps=0", "exp.sft.clean_steps=2", "exp.sft.steps=2",
            "exp.sft.log_every=1", "exp.sft.optim.warmup_steps=1", "exp.eval.n_tasks=4", "exp.eval.passes=2",
            "exp.pool_size=8", "rl.prompts_per_step=2", "exp.n_sft_tasks=32", "exp.plot=true",
            "agent.max_new_tokens=16", "rl.sampler.min_batch_bucket=8", "rl.sampler.min_new_bucket=16",
            "rl.batch.min_rows=8", "rl.batch.min_seq=128"]
    argv = [f"--config={ROOT / 'configs' / 'rl_tiny.py'}", f"--config.exp.out_dir={out}"]
    argv += [f"--config.{s}" for s in sets]
    summary = _driver().main(argv)
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    phases = [r["phase"] for r in recs]
    assert phases.count("sft") == 2 and phases.count("rl") == 1 and phases.count("eval") == 2
    assert phases.count("sft_clean") == 2                           # the two-stage warm start
    chk = next(r for r in recs if r["phase"] == "sft_check")       # the sandbox-free SFT gate ran
    assert 0.0 <= chk["greedy_wellformed"] <= 1.0 and isinstance(chk["greedy_example"], str)
    rl = next(r for r in recs if r["phase"] == "rl")
    for k in ("reward_mean", "best_of_k", "loss", "grad_norm", "success", "rollout_s", "train_s"):
        assert k in rl and rl[k] == rl[k], k           # present and not NaN
    assert rl["rows"] == 8                              # 2 prompts x 4 rollouts, one segment each
    ev = [r for r in recs if r["phase"] == "eval"]
    assert [e["step"] for e in ev] == [0, 1] and all(len(e["heldout_passes"]) == 2 for e in ev)
    assert (out / "ckpt" / "1").is_dir() and (out / "sft" / "2").is_dir()    # orbax checkpoints
    assert (out / "sft_clean" / "2").is_dir()
    assert (out / "rewards.png").stat().st_size > 1000
    assert json.loads((out / "summary.json").read_text())["steps"] == summary["steps"] == 1
    # a rerun resumes from the RL checkpoint (no SFT, no new RL step) and rewrites the summary
    again = _driver().main(argv)
    assert again["steps"] == 1


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(3600)   # five strategies' RL compiles: > 900 s on 2 shared cores (docs/PERF.md)
def test_selfsum_driver_end_to_end(tmp_path):
    """experiments/selfsum.py at toy size: equal-share demos of every strategy, one SFT, RL per strategy from
    the same params (train_step donates its state: the second run must not see deleted buffers), the
    per-episode eval, the table with CIs and paired differences."""
    from horizon.sandbox import docker_available

    if not docker_available():
        pytest.skip("\n\n*** DOCKER ENGINE NOT AVAILABLE: the selfsum driver smoke test was SKIPPED ***\n")
    spec = importlib.util.spec_from_file_location("selfsum_driver", ROOT / "experiments" / "selfsum.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "ss"
    argv = [f"--config={ROOT / 'configs' / 'selfsum_tiny.py'}", f"--config.exp.out_dir={out}"]
    argv += [f"--config.{s}" for s in ("exp.steps=1", "rl.optim.warmup_steps=0", "exp.sft.steps=2",
                                       "exp.sft.clean_steps=2", "exp.sft.optim.warmup_steps=1", "exp.sft.log_every=1",
                                       "exp.n_sft_tasks=8", "exp.eval.n_tasks=4", "exp.check_tasks=2",
                                       "exp.sft.batch_size=4", "exp.sft.clean_batch_size=4", "exp.pool_size=32",
                                       "exp.seeds=(0,)", "exp.sft.probe_every=0")]
    res = mod.main(argv)
    strategies = ("self_summary", "prompt_compaction", "summarizing_condenser", "observation_masking", "sliding_window")
    assert set(res["rows"]) == set(strategies)
    recs = [json.loads(x) for x in (out / "seed0" / "metrics.jsonl").read_text().splitlines()]
    assert {r["phase"] for r in recs} >= {"sft_clean", "sft", "key_copy_check"}   # both SFT stages, then the gate
    chk = next(r for r in recs if r["phase"] == "key_copy_check")
    assert {"self_summary_summary_key_acc", "self_summary_final_key_acc", "prompt_compaction_summary_key_acc",
            "summarizing_condenser_summary_key_acc", "observation_masking_note_key_acc"} <= set(chk)
    assert not any(k.startswith("sliding_window_summary") for k in chk)          # the window writes no summary
    md = (out / "selfsum.md").read_text()
    assert sum(x.startswith("| ") for x in md.splitlines()) == 6       # header + one row per strategy
    assert "compaction-caused errors: self-summary" in md and "wall time" in md
    assert (out / "selfsum.png").stat().st_size > 1000
