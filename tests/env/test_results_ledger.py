"""The study ledger and docs/RESULTS.md's renderer (horizon.studies.ledger, horizon.studies.gains,
horizon.studies.results_md, experiments/results.py): validation, last-row-wins, paired gains checked
by hand on a few synthetic episodes, and the script's --check. Plain numpy; no JAX compiles."""

import importlib.util
import json
import pathlib

import numpy as np
import pytest

from horizon.studies import gains, ledger, results_md, swe_results

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROV = dict(git_commit="0123456789abcdef0123", git_dirty=False, started_at="2026-01-02T03:04:05+00:00", host="h")


def row(seed=0, task="t1", pass_index=0, phase="sft", solved=False, strategy="self_summary", **kw):
    base = dict(study="selfsum", trigger=256, seed=seed, strategy=strategy, phase=phase, task_id=task,
                pass_index=pass_index, solved=solved, summaries=1, summary_tokens=40, generated_tokens=100,
                compaction_error=False, needed_seen=0, needed_kept=0, distractors_seen=0, distractors_kept=0,
                provenance=PROV)
    return dict(base, **kw)


def test_append_validates_every_row_before_writing(tmp_path):
    path = tmp_path / "sub" / "s.jsonl"
    bad = [row(solved=1), row(phase="final"), row(needed_seen=1, needed_kept=2), row(summaries=-1),
           {k: v for k, v in row().items() if k != "provenance"}, row(seed=True)]
    fields = ["solved", "phase", "needed_kept", "summaries", "provenance", "seed"]
    for b, field in zip(bad, fields):
        with pytest.raises(ValueError, match=f"row 1: field '{field}'") as e:
            ledger.append_rows(path, [row(), b])
        assert "\n" not in str(e.value)
        assert not path.exists()                              # nothing written, not even the good row
    assert ledger.append_rows(path, [row(extra="kept"), row(task="t2", summaries=np.int64(2), solved=np.bool_(1))]) == 2
    rows = ledger.read_rows(path)
    assert rows[0]["extra"] == "kept" and rows[1]["summaries"] == 2 and rows[1]["solved"] is True


def test_last_row_wins_on_key_fields(tmp_path):
    path = tmp_path / "s.jsonl"
    ledger.append_rows(path, [row(task="a"), row(task="b"), row(task="a", pass_index=1)])
    ledger.append_rows(path, [row(task="b", solved=True), row(task="c"), row(task="b", phase="rl")])
    rows = ledger.read_rows(path)
    assert [(r["task_id"], r["pass_index"], r["phase"]) for r in rows] == [
        ("a", 0, "sft"), ("b", 0, "sft"), ("a", 1, "sft"), ("c", 0, "sft"), ("b", 0, "rl")]
    assert rows[1]["solved"] is True                         # the rerun replaced the first "b" in place
    assert ledger.ledger_path("selfsum", tmp_path) == tmp_path / "docs" / "results" / "selfsum.jsonl"


def hand_example():
    """Four paired units over two seeds, plus one unit on each side only (excluded)."""
    a = [row(0, "t1", 0, "rl", True, needed_seen=2, needed_kept=2, distractors_seen=1),
         row(0, "t1", 1, "rl", True, needed_seen=1, needed_kept=1),
         row(0, "t2", 0, "rl", False),                                       # never compacted: a unit, no carry
         row(1, "t1", 0, "rl", True, needed_seen=2, needed_kept=1, distractors_seen=2, distractors_kept=1),
         row(1, "t9", 0, "rl", True, needed_seen=5, needed_kept=5)]          # a only
    b = [row(0, "t1", 0, "sft", False, needed_seen=2, needed_kept=1, distractors_seen=1, distractors_kept=1),
         row(0, "t1", 1, "sft", True, needed_seen=1, needed_kept=1),
         row(0, "t2", 0, "sft", False),
         row(1, "t1", 0, "sft", False, needed_seen=2, needed_kept=0, distractors_seen=2, distractors_kept=2),
         row(0, "t2", 1, "sft", True, distractors_seen=4)]                   # b only
    return a, b


def test_paired_gain_by_hand():
    a, b = hand_example()
    g = gains.paired_gain(a, b, "success", samples=500, level=0.9, seed=1)
    assert g["diff"] == pytest.approx(3 / 4 - 1 / 4) and g["units"] == 4 and g["seeds"] == [0, 1]
    assert g["ci_lo"] <= g["diff"] <= g["ci_hi"]
    n = gains.paired_gain(a, b, "needed_carry", samples=500)
    assert n["diff"] == pytest.approx(4 / 5 - 2 / 5)                        # (2+1+1)/5 - (1+1+0)/5
    d = gains.paired_gain(a, b, "distractor_carry", samples=500)
    assert d["diff"] == pytest.approx(1 / 3 - 3 / 3)
    for g in (n, d):
        assert g["ci_lo"] <= g["diff"] + 1e-12 and g["diff"] <= g["ci_hi"] + 1e-12 and g["units"] == 4
    with pytest.raises(ValueError, match="metric"):
        gains.paired_gain(a, b, "reward")
    with pytest.raises(ValueError, match="two rows"):
        gains.paired_gain(a + a[:1], b)


def test_paired_gain_ci_collapses_when_every_unit_differs_alike():
    a = [row(s, f"t{t}", p, "rl", True, needed_seen=2, needed_kept=2) for s in range(3) for t in range(5)
         for p in range(2)]
    b = [dict(r, phase="sft", solved=False, needed_kept=1) for r in a]
    g = gains.paired_gain(a, b, "success", samples=300)
    assert (g["diff"], g["ci_lo"], g["ci_hi"], g["units"]) == (1.0, 1.0, 1.0, 30)
    c = gains.paired_gain(a, b, "needed_carry", samples=300)
    assert c["diff"] == c["ci_lo"] == c["ci_hi"] == pytest.approx(0.5)


def test_carry_none_cases():
    a, b = hand_example()
    assert gains.carry(a, "needed") == pytest.approx(9 / 10)
    assert gains.carry([row(), row()], "needed") is None and gains.carry([], "distractors") is None
    empty = [row(0, "t1", 0, "rl", True), row(0, "t2", 0, "rl")]
    g = gains.paired_gain(empty, [dict(r, phase="sft", needed_seen=3, needed_kept=3) for r in empty], "needed_carry")
    assert (g["diff"], g["ci_lo"], g["ci_hi"], g["units"], g["seeds"]) == (None, None, None, 2, [0])
    none = gains.paired_gain(a, [row(7, "x")], "success")
    assert none["diff"] is None and none["units"] == 0 and none["seeds"] == []
    with pytest.raises(ValueError, match="kind"):
        gains.carry(a, "facts")


def test_phase_row_and_success_ci():
    rows = [row(0, "t1", 0, solved=True, summaries=2, summary_tokens=30, compaction_error=False),
            row(0, "t2", 0, solved=False, summaries=1, summary_tokens=30, compaction_error=True, needed_seen=2),
            row(1, "t1", 0, solved=True, summaries=0, summary_tokens=0),
            row(1, "t2", 0, solved=False, summaries=1, summary_tokens=30, needed_seen=2, needed_kept=1)]
    p = gains.phase_row(rows, samples=400)
    assert p["episodes"] == 4 and p["seeds"] == [0, 1] and p["success"] == 0.5
    assert p["ci_lo"] <= 0.5 <= p["ci_hi"]
    assert (p["compaction_errors"], p["compaction_error_rate"]) == (1, 0.25)
    assert p["needed_carry"] == 0.25 and p["distractor_carry"] is None
    assert p["tokens_per_summary"] == 90 / 4 and p["summaries_per_episode"] == 1.0 and p["summaries_per_solved"] == 1.0
    assert gains.phase_row([row()], samples=10)["summaries_per_solved"] is None
    assert gains.success_ci([]) == (None, None, None)


def synthetic_ledger():
    rows = []
    for s in (0, 1):
        for t in ("t1", "t2"):
            rows += [row(s, t, 0, "sft", t == "t1", needed_seen=2, needed_kept=1, run_wall_s=100.0 + s,
                         command="python experiments/selfsum.py", provenance=dict(PROV, host=f"h{s}")),
                     row(s, t, 0, "rl", True, needed_seen=2, needed_kept=2, run_wall_s=100.0 + s,
                         command="python experiments/selfsum.py", provenance=dict(PROV, host=f"h{s}")),
                     row(s, t, 0, "sft", False, strategy="sliding_window", trigger=512,
                         provenance=dict(PROV, git_commit="fedcba9876543210", started_at="2026-01-05T00:00:00+00:00"))]
    return rows


def test_render_tables_and_provenance():
    text = results_md.render({"selfsum": synthetic_ledger()}, notes_by_study={"selfsum": "A note.\n"}, samples=200)
    assert text.startswith("# Results\n") and "python experiments/results.py" in text and "by hand" in text
    assert "### selfsum, compaction trigger 256 tokens" in text and "### selfsum, compaction trigger 512 tokens" in text
    assert text.index("trigger 256") < text.index("trigger 512")
    assert "| self_summary | post-SFT | 4 | 0, 1 | 0.500 [" in text
    assert "| 0 (0.000) | 0.500 | n/a | 40.000 | 1.000 | 1.000 |" in text
    assert "| self_summary | post-RL | 4 | 0, 1 | 1.000 [1.000, 1.000] |" in text
    assert text.index("post-SFT") < text.index("post-RL")
    assert "| sliding_window | post-SFT | 4 | 0, 1 | 0.000 [0.000, 0.000] |" in text
    assert "**RL gain (post-RL − post-SFT), paired**" in text and "headroom" not in text
    assert "| self_summary | +0.500 [" in text and "| +0.500 [+0.500, +0.500] | n/a | 4 | 0, 1 |" in text
    assert "`0123456789`" in text and "`fedcba9876`" in text and "0123456789a" not in text
    assert "started 2026-01-02T03:04:05+00:00 to 2026-01-05T00:00:00+00:00" in text
    assert "arms' wall time 201 s over 2 arm(s)" in text and "command `python experiments/selfsum.py`" in text
    assert text.rstrip().endswith("A note.")
    oracle = [dict(r, phase="oracle", solved=True) for r in synthetic_ledger() if r["phase"] == "sft"]
    text = results_md.render({"selfsum": synthetic_ledger() + oracle}, samples=200)
    assert "**headroom (oracle − post-SFT), paired**" in text
    assert "| sliding_window | +1.000 [+1.000, +1.000] | n/a | n/a | 4 | 0, 1 |" in text
    assert "oracle summaries" in text and "wall time" not in results_md.render({"s": [row()]}, samples=10)


def load_script():
    spec = importlib.util.spec_from_file_location("results_driver", ROOT / "experiments" / "results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_results_script_check(tmp_path, capsys):
    script = load_script()
    ledger.append_rows(ledger.ledger_path("selfsum", tmp_path), synthetic_ledger())
    (tmp_path / "docs" / "results" / "selfsum.md").write_text("Notes on the run.\n")
    assert script.main(["--check"], root=tmp_path) == 1                      # no RESULTS.md yet
    assert not (tmp_path / "docs" / "RESULTS.md").exists()
    assert script.main([], root=tmp_path) == 0
    out = tmp_path / "docs" / "RESULTS.md"
    assert "Notes on the run." in out.read_text() and "## selfsum" in out.read_text()
    capsys.readouterr()
    assert script.main(["--check"], root=tmp_path) == 0
    out.write_text(out.read_text().replace("post-RL", "post-rl", 1))
    assert script.main(["--check"], root=tmp_path) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stale" in err
    ledger.append_rows(ledger.ledger_path("selfsum", tmp_path), [row(seed=2)])   # a new seed: stale again
    script.main([], root=tmp_path)
    assert script.main(["--check"], root=tmp_path) == 0
    assert json.loads((tmp_path / "docs" / "results" / "selfsum.jsonl").read_text().splitlines()[-1])["seed"] == 2


def test_committed_results_are_current(capsys):
    """docs/RESULTS.md is what experiments/results.py builds from the committed ledgers and notes."""
    assert load_script().main(["--check"]) == 0, capsys.readouterr().err


def test_summary_examples_pair_the_same_episode_before_and_after_rl():
    from horizon.studies.results_md import summary_examples

    rows = [row(task=t, phase=ph, needed_seen=4, needed_kept=k, last_summary=f"{ph} memory of {t}",
                final_answer="#A", expected="#A #B")
            for t, ph, k in (("t1", "sft", 1), ("t1", "rl", 4), ("t2", "sft", 2), ("t2", "rl", 2),
                             ("t3", "sft", 3), ("t3", "rl", 1), ("t4", "sft", 0))]       # t4: no post-RL row
    text = summary_examples(rows, n=2)
    assert "the 2 episodes of 3 whose needed facts kept changed most" in text
    assert text.index("task `t1`") < text.index("task `t3`") and "task `t2`" not in text    # |+3| then |-2|
    assert "| post-SFT | 1/4 |" in text and "| post-RL | 4/4 |" in text
    assert "```text\nsft memory of t1\n```" in text and "```text\nrl memory of t3\n```" in text
    assert summary_examples([r for r in rows if r["phase"] == "sft"]) is None


def swe_record(task="parse__x-1", pass_index=0, solved=False, turns=6, tool_calls=5, malformed=0, mode="wrong_edit",
               **kw):
    """One `harness.run_eval` record of a SWE-bench episode with its diagnosis fields."""
    return dict(dict(task_id=task, pass_index=pass_index, solved=solved, turns=turns, tool_calls=tool_calls,
                     malformed_calls=malformed, summaries=0, swe_kind="off_by_one", swe_mode=mode, swe_right_file=True,
                     swe_right_hunk=False, end_reason="final"), **kw)


def test_swe_rows_validate_and_count_calls_within_turns(tmp_path):
    recs = [swe_record(), swe_record(task="cachetools__y-2", solved=True, mode="solved", summaries=2),
            swe_record(pass_index=1, turns=4, tool_calls=2, malformed=2, mode="malformed")]
    rows = swe_results.eval_rows(recs, study="swe_real", seed=0, phase="sft", split="unseen",
                                 repo_of=lambda t: t.split("__")[0], provenance=PROV, command="x")
    path = tmp_path / "swe_real.jsonl"
    assert ledger.append_rows(path, rows) == 3
    back = ledger.read_rows(path)
    assert [(r["repo"], r["failure_mode"], r["schema"]) for r in back] == [
        ("parse", "wrong_edit", "swe"), ("cachetools", "solved", "swe"), ("parse", "malformed", "swe")]
    for bad, field in ((dict(rows[0], malformed_calls=3), "tool_calls"), (dict(rows[0], phase="oracle"), "phase"),
                       (dict(rows[0], schema="other"), "schema"), (dict(rows[0], right_file=1), "right_file")):
        with pytest.raises(ValueError, match=field):
            ledger.validate_row(bad)
    ledger.append_rows(path, [dict(rows[0], solved=True, failure_mode="solved")])    # a rerun replaces the episode
    assert [r["solved"] for r in ledger.read_rows(path)] == [True, True, False]


def test_swe_section_numbers_by_hand():
    """2 tasks x 2 passes after SFT: success 1/4; turns 6+6+4+4 = 20 of which 2 malformed, so
    well-formed 18/20 = 0.9; tool calls (5+5+2+2)/4 = 3.5 per episode; one episode summarized twice."""
    recs = [swe_record(task="a", solved=True, mode="solved", summaries=2), swe_record(task="b"),
            swe_record(task="a", pass_index=1, turns=4, tool_calls=2, malformed=2, mode="malformed"),
            swe_record(task="b", pass_index=1, turns=4, tool_calls=2)]
    rows = swe_results.eval_rows(recs, study="swe_real", seed=0, phase="sft", split="unseen", repo_of=lambda t: "r",
                                 provenance=PROV)
    line = swe_results.phase_line(rows, samples=200, level=0.95, seed=0)
    assert line["success"].startswith("0.250 [") and line["wellformed"].startswith("0.900 [")
    assert (line["actions"], line["right_file"], line["right_hunk"], line["summarized"]) == ("3.500", "1.000", "0.000",
                                                                                             "1 (2.000)")
    md = results_md.render({"swe_real": rows})
    assert "### unseen instances of the train repositories" in md and "| post-SFT | 4 | 2 | 0 | 0.250 [" in md
    assert "| post-SFT | 1 | 1 | 0 | 0 | 2 | 0 | 0 |" in md     # solved, malformed, no_edit, wrong_file, wrong_edit
    assert "| off_by_one | 1/4 |" in md and "held-out repositories" not in md
