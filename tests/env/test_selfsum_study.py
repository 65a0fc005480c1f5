"""The self-summarization study's metrics, equal-treatment demos and pipeline (horizon.studies.selfsum,
horizon.studies.selfsum_metrics; docs/SPEC.md §6). Metric tests use synthetic records with numbers
checkable by hand; the smoke test runs the study's pipeline without a model (the demonstrator as
the policy, LocalSandbox pool) in a few seconds."""

import importlib.util
import pathlib

import ml_collections
import numpy as np
import pytest

from horizon.agent import run_episodes
from horizon.data.tokenizer import tokenizer_from_config
from horizon.env.demos import KeyRecallDemoPolicy, mask_final_turn
from horizon.env.families import family_from_config, make_episode
from horizon.sandbox import open_sandbox
from horizon.studies import selfsum as ss
from horizon.studies import selfsum_metrics as sm
from horizon.tasks import verify
from horizon.utils.config import ConfigError, load_config_file

TOK = tokenizer_from_config(load_config_file("configs/selfsum_tiny.py"))   # the study's BPE
ROOT = pathlib.Path(__file__).resolve().parents[2]
REPORT = ml_collections.ConfigDict(dict(bootstrap_samples=2000, ci_level=0.95, bootstrap_seed=0, copy_threshold=0.8))


def rec(seed, task, solved, **kw):
    base = dict(strategy="s", seed=seed, task_id=task, solved=solved, generated_tokens=100, summaries=1,
                summary_tokens=40, rewrites=1, prefill_tokens=10, compaction_error=False)
    return dict(base, **kw)


def test_compaction_error_and_prefill():
    assert sm.compaction_error(False, ["key #Q"], "Summary: key #Z, last 3.log")        # lossy summary
    assert not sm.compaction_error(False, ["key #Q"], "Summary: key #Q, last 3.log")    # kept: failed otherwise
    assert not sm.compaction_error(True, ["key #Q"], "")                               # solved: never
    assert not sm.compaction_error(False, [], "")                                      # never compacted
    assert sm.common_prefix(np.array([1, 2, 3]), np.array([1, 2, 9, 9])) == 2
    assert sm.common_prefix(np.array([1, 2]), np.array([1, 2, 3])) == 2
    # 5 positions + (4 - 2 shared) = 7 computed, 3 of them decoded: 4 prefilled
    assert sm.prefill_tokens([np.array([1, 2, 3, 4, 5]), np.array([1, 2, 9, 9])], 3) == 4
    assert sm.prefill_tokens([np.array([7, 7, 7])], 1) == 2


def test_bootstrap_and_paired_differences():
    assert sm.bootstrap_ci({0: {"a": [1, 1], "b": [1]}}, samples=200, level=0.95, seed=0) == (1.0, 1.0)
    # one seed, tasks a (solved twice) and b (failed twice): replicates 0, 0.5, 1 with prob 1/4, 1/2, 1/4
    lo, hi = sm.bootstrap_ci({0: {"a": [1, 1], "b": [0, 0]}}, samples=4000, level=0.95, seed=0)
    assert (lo, hi) == (0.0, 1.0)
    lo, hi = sm.bootstrap_ci({0: {"a": [1, 1], "b": [0, 0]}}, samples=4000, level=0.4, seed=0)
    assert (lo, hi) == (0.5, 0.5)
    a = [rec(0, "t1", True), rec(0, "t2", False), rec(1, "t1", True), rec(1, "t2", True)]
    b = [rec(0, "t1", False), rec(0, "t2", False), rec(1, "t1", True), rec(1, "t2", False), rec(2, "t1", True)]
    assert sm.paired_differences(a, b) == {0: 0.5, 1: 0.5}


def test_strategy_row_by_hand():
    rs = [rec(0, "a", True, summaries=1, summary_tokens=40, prefill_tokens=10),
          rec(0, "b", False, summaries=2, summary_tokens=80, prefill_tokens=20, compaction_error=True),
          rec(1, "a", True, summaries=0, summary_tokens=0, prefill_tokens=30, rewrites=0),
          rec(1, "b", False, summaries=1, summary_tokens=40, prefill_tokens=40)]
    row = sm.strategy_row(rs, baseline=None, samples=500, level=0.95, seed=0)
    assert row["success"] == 0.5 and row["episodes"] == 4 and row["seeds"] == 2
    assert row["ci_lo"] <= 0.5 <= row["ci_hi"] and row["paired_diff"] is None
    assert row["compaction_errors"] == 1 and row["compaction_error_rate"] == 0.25
    assert row["tokens_per_summary"] == 40.0             # 160 tokens / 4 summaries
    assert row["gen_tokens_per_solved"] == 200.0         # 400 generated / 2 solved
    assert row["prefill_per_episode"] == 25.0 and row["summaries_per_episode"] == 1.0
    assert row["rewrites_per_episode"] == 0.75 and row["summaries_per_solved"] == 0.5   # (1 + 0) / 2 solved
    none = sm.strategy_row([rec(0, "a", False, summaries=0, summary_tokens=0)], baseline=rs, samples=100,
                           level=0.95, seed=0)
    assert none["tokens_per_summary"] is None and none["gen_tokens_per_solved"] is None
    assert none["paired_diff"] == {0: -0.5}


def test_balance_rows_and_masks():
    m = lambda n: (np.zeros(n + 1, np.int32), np.array([False] + [True] * n))  # noqa: E731
    rows = {"a": [m(3), m(3), m(3)], "b": [m(5), m(5), m(5)]}
    out = ss.balance_rows(rows)
    assert [int(r[1].sum()) for r in out] == [3, 3, 3, 5, 5]       # budget 9 = a's total; b's crossing row kept
    assert ss.balance_rows({}) == []
    mask = np.array([False, True, True, False, True, True, True, False])
    assert mask_final_turn(None, mask).tolist() == [False, True, True, False, False, False, False, False]
    assert ss.memory_kind("x<summary>key ") == "summary" and ss.memory_kind("<summary>a</summary><think>") == "note"
    assert ss.memory_kind("<think>a</think><final>") == "final"
    # key_relay's per-slot copy check: (keys in this memory, slot), the earlier summary's keys not counted
    before = "Summary: key #A, last 2.log<summary>key #A, key #"
    assert ss.memory_slot(before, "O, key #N, last 8.log</summary><final>#A") == (3, 2)
    assert ss.memory_slot("key #A<summary>key #", "A, last 1.log</summary>") == (1, 1)
    assert ss.memory_slot("<think>key #", "Z</think>") == (1, 1)


def test_copy_check_lines_and_table():
    chk = {"self_summary_summary_key_acc": 0.95, "self_summary_final_key_acc": 0.9,
           "prompt_compaction_summary_key_acc": 0.5, "observation_masking_note_key_acc": 0.7}
    lines = ss.copy_check_lines(chk, ("self_summary", "prompt_compaction", "observation_masking", "sliding_window"),
                                0.8)
    assert lines == ["self_summary: key in memory 0.95 ok, answer copy 0.90",
                     "prompt_compaction: key in memory 0.50 BELOW 0.80, answer copy n/a",
                     "observation_masking: key in memory 0.70, answer copy n/a",
                     "sliding_window: key in memory n/a, answer copy n/a"]
    ev = lambda recs: {"start": {"heldout_mean": 0.25}, "end": {"episodes": recs}}  # noqa: E731
    results = {0: {"self_summary": ev([rec(0, "a", True), rec(0, "b", True)]),
                   "prompt_compaction": ev([rec(0, "a", True, summary_tokens=200),
                                            rec(0, "b", False, compaction_error=True, summary_tokens=200)])}}
    rows = ss.study_rows(results, REPORT)
    assert rows["prompt_compaction"]["paired_diff"] == {0: -0.5} and rows["self_summary"]["sft_success"] == 0.25
    md = ss.table(rows, 0.95)
    assert md.count("\n| ") == 2 and "| prompt_compaction | 0.250 | 0.500 [" in md
    assert "compaction-caused errors: self-summary 0 vs prompt compaction 1 (fewer, 100% fewer)" in md
    assert "tokens per summary: self-summary 40 vs prompt compaction 200 (0.20x)" in md
    assert "success vs prompt_compaction:" in md
    assert "paired diff prompt_compaction - self-summary per seed -0.500" in md


def test_key_token_positions_find_each_memory_and_answer():
    """The copy check's scored positions under the study's BPE (where " #" is one token and the
    letter another) and under bytes: every strategy's memory kind and the answer, each a key letter."""
    from horizon.data.tokenizer import ByteTokenizer
    from horizon.env.demos import ordered_keys

    c = load_config_file("configs/selfsum_tiny.py")
    c.exp.n_sft_tasks, c.exp.demo_sandboxes = 2, 2
    fam = family_from_config(c.exp)
    want = {"self_summary": {"summary", "final"}, "prompt_compaction": {"summary", "final"},
            "summarizing_condenser": {"summary", "final"}, "observation_masking": {"note", "final"},
            "sliding_window": set()}                     # its answer is a guess: the key left the context
    for s, kinds in want.items():
        got = set()
        for tokens, mask in ss.demo_rows(fam, c, TOK, (s,), 0.0):
            for i in ss.key_token_positions(tokens, mask, ordered_keys(TOK.decode(tokens)), TOK):
                assert TOK.decode([int(tokens[i])]) in c.exp.task.key_alphabet and mask[i]
                got.add(ss.memory_kind(TOK.decode(tokens[:i])))
        assert got == kinds, s
    byte = ByteTokenizer()
    t = byte.encode("key #Q seen<summary>key #Q</summary><final>#Q</final>")
    m = np.zeros(len(t), bool)
    m[11:] = True                                        # the observation's key is not trained on
    pos = ss.key_token_positions(t, m, ["Q"], byte)
    assert [byte.decode([t[i]]) for i in pos] == ["Q", "Q"]
    assert [ss.memory_kind(byte.decode(t[:i])) for i in pos] == ["summary", "final"]
    _, w = ss.weight_key_tokens(t, m.astype(np.float32), byte, 10.0)   # stage 1's exp.sft.clean_key_weight
    assert sorted(np.nonzero(w == 10.0)[0].tolist()) == pos and np.all(w[m & (w != 10.0)] == 1.0)
    assert np.all(w[~m] == 0.0)                          # untrained positions stay untrained


def test_episode_record_on_scripted_episodes():
    c = load_config_file("configs/selfsum_tiny.py")
    fam = family_from_config(c.exp)
    sb = open_sandbox("local")
    try:
        out = {}
        for strategy, corrupt in (("self_summary", 0.0), ("self_summary", 1.0), ("sliding_window", 0.0),
                                  ("observation_masking", 0.0)):
            t = fam.make_task(4)
            fam.reset(sb, t)
            ep = make_episode(fam, t, sb, TOK, ss.with_strategy(c, strategy).agent)
            run_episodes(KeyRecallDemoPolicy(TOK, corrupt, notes=strategy == "observation_masking"), [ep])
            solved = verify(t, sb, ep.final_answer, check_edits=False).reward == 1.0
            out[(strategy, corrupt)] = ss.episode_record(ep, solved, strategy, 0, TOK)
    finally:
        sb.close()
    clean, lossy = out[("self_summary", 0.0)], out[("self_summary", 1.0)]
    assert clean["solved"] and not clean["compaction_error"] and clean["summaries"] == 1 and clean["rewrites"] == 1
    assert not lossy["solved"] and lossy["compaction_error"]            # the summary lost the key
    assert clean["generated_tokens"] == 158 and 0 < clean["prefill_tokens"]   # configs/selfsum_tiny.py docstring table
    window = out[("sliding_window", 0.0)]
    assert window["compaction_error"] == (not window["solved"])        # the window dropped the key
    assert out[("observation_masking", 0.0)]["solved"] and not out[("observation_masking", 0.0)]["compaction_error"]


def _driver():
    spec = importlib.util.spec_from_file_location("selfsum_driver", ROOT / "experiments" / "selfsum.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_driver_config_quick_and_validation():
    mod = _driver()
    base = [f"--config={ROOT / 'configs' / 'selfsum_tiny.py'}", "--config.exp.backend=local",
            "--config.exp.demo_backend=local"]
    c = mod.load_config(base + ["--config.exp.quick=True"])
    assert tuple(c.exp.seeds) == (0,) and int(c.rl.optim.steps) == int(c.exp.steps) == 2
    assert int(c.rl.optim.warmup_steps) == 1                  # quick's other section (rl), merged too
    assert len(c.exp.strategies) == 5 and "clean_strategies" not in c.exp.sft
    assert c.exp.sft.clean_key_weight == 30.0 and c.exp.sft.clean_steps == 800   # quick's stage 1 (docs/PERF.md)
    for bad in ("--config.exp.seeds=(1,1)", "--config.exp.strategies=('prompt_compaction',)",
                "--config.exp.report.ci_level=1.0"):
        with pytest.raises(SystemExit):
            mod.load_config(base + [bad])
    c = load_config_file("configs/selfsum_tiny.py")
    c.exp.env = "config_edit"
    with pytest.raises(ConfigError, match="exp.env"):
        ss.validate_study(c)
    assert sum(1 for _ in open(ROOT / "experiments" / "selfsum.py")) < 150


def test_study_pipeline_smoke(tmp_path):
    """Everything the driver does but the model: equal-share demos of every strategy in both SFT
    stages, the per-episode held-out eval in a sandbox pool (the demonstrator as the policy), the
    table and the figure."""
    from horizon.env.rollouts import SandboxPool
    from horizon.rl.runtime import workers

    c = load_config_file("configs/selfsum_tiny.py")
    c.exp.update(dict(backend="local", demo_backend="local", n_sft_tasks=4, demo_sandboxes=4, pool_size=4))
    c.exp.eval.update(dict(n_tasks=2, passes=2))
    fam = family_from_config(c.exp)
    demos = ss.warm_start_demos(fam, c, TOK)
    for clean in (True, False):
        rows = demos(clean)
        assert rows and all(len(t) == len(m) and m.any() for t, m in rows)
    heldout = fam.tasks("heldout", 2)
    pool = SandboxPool.from_config(c)
    results = {}
    try:
        for s in c.exp.strategies:
            cs = ss.with_strategy(c, s)
            env = workers.family_env(cs, pool=pool)
            policy = KeyRecallDemoPolicy(TOK, 0.0, notes=s == "observation_masking")
            ev = ss.study_evaluator(env, heldout, cs, TOK, strategy=s, policy_fn=lambda p, step, _p=policy: _p)(None, 0)
            assert len(ev["episodes"]) == 4 and {e["pass_index"] for e in ev["episodes"]} == {0, 1}
            results[s] = {"start": ev, "end": ev}
    finally:
        pool.close()
    rows = ss.study_rows({0: results}, REPORT)
    assert rows["self_summary"]["success"] == 1.0 and rows["sliding_window"]["success"] < 1.0
    assert rows["sliding_window"]["compaction_errors"] >= 1 and rows["self_summary"]["compaction_errors"] == 0
    assert rows["self_summary"]["tokens_per_summary"] < rows["prompt_compaction"]["tokens_per_summary"]
    md = ss.table(rows, 0.95)
    assert md.count("\n| ") == 5
    ss.plot(rows, tmp_path / "selfsum.png")
    assert (tmp_path / "selfsum.png").stat().st_size > 1000


def test_logged_results_reuse_only_finished_strategies(tmp_path):
    """A rerun of a killed study takes a strategy from its seed's metrics.jsonl only when both its
    step-0 and its last eval are there (the last record of a step wins); other seeds' are ignored."""
    import json

    ev = lambda run, step, mean: dict(phase="eval", run=run, step=step, heldout_mean=mean, episodes=[])  # noqa: E731
    recs = [ev("seed 0 self_summary", 0, 0.4), dict(phase="rl", run="seed 0 self_summary", step=1),
            ev("seed 0 self_summary", 4, 0.5), ev("seed 0 self_summary", 4, 0.6),      # a resumed rerun's end
            ev("seed 0 prompt_compaction", 0, 0.3),                                      # killed mid-RL
            ev("seed 1 sliding_window", 0, 0.0), ev("seed 1 sliding_window", 4, 0.1)]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    got = ss.logged_results(path, 0, ("self_summary", "prompt_compaction", "sliding_window"), 4)
    assert set(got) == {"self_summary"}
    assert (got["self_summary"]["start"]["heldout_mean"], got["self_summary"]["end"]["heldout_mean"]) == (0.4, 0.6)
    assert ss.logged_results(path, 0, ("self_summary",), 12) == {}                 # a longer run is not finished
    assert ss.logged_results(tmp_path / "absent.jsonl", 0, ("self_summary",), 4) == {}
