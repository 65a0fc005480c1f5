"""A study whose arms are RL runs (horizon.studies.arms): the rows a run appends, their validation and
identity, and the section's numbers by hand. Plain numpy; no JAX compiles."""

import pathlib

import ml_collections
import pytest

from horizon.eval.sweep import load_sweep
from horizon.studies import arms, fit, ledger, results_md
from horizon.utils.config import load_config_file

PROV = dict(git_commit="0123456789abcdef0123", git_dirty=False, started_at="2026-01-02T03:04:05+00:00", host="h")


def records(solved: list[bool], tokens: int = 50) -> list[dict]:
    """`loop.evaluate` episode records of 2 tasks x len(solved) / 2 passes."""
    return [dict(task_id=f"t{i % 2}", pass_index=i // 2, solved=s, completion_tokens=tokens + i, tool_calls=1, turns=1)
            for i, s in enumerate(solved)]


def run(arm="a", seed=0, start=(False, False, True, False), end=(True, True, True, False), diff=0.01):
    evals = {0: dict(records=records(list(start))), 40: dict(records=records(list(end), tokens=30))}
    steps = [dict(phase="rl", reward_mean=0.5 + 0.1 * i, sampler_logprob_diff=diff, sampler_logprob_diff_max=0.1,
                  **{"routing/own_vs_sampler": 0.2, "routing/trained_vs_sampler": 0.0}) for i in range(3)]
    return arms.run_rows(evals, [dict(phase="eval"), *steps], study="s", arm=arm, seed=seed, provenance=PROV,
                         command="experiments/rl.py --config=configs/rl_tiny.py")


def test_a_run_gives_rows_of_its_first_and_last_eval_with_its_training_means():
    rows = run()
    assert [(r["phase"], r["step"]) for r in rows] == [("sft", 0)] * 4 + [("rl", 40)] * 4
    assert all(r["train"] == pytest.approx(dict(reward_mean=0.6, sampler_logprob_diff=0.01,
                                                sampler_logprob_diff_max=0.1, steps=3,
                                                **{"routing/own_vs_sampler": 0.2, "routing/trained_vs_sampler": 0.0}))
               for r in rows)
    for r in rows:
        ledger.validate_row(r)


def test_arm_rows_validate_and_a_rerun_replaces_its_arm(tmp_path):
    book = tmp_path / "s.jsonl"
    bad = dict(run()[0], tool_calls=2)
    with pytest.raises(ValueError, match="field 'tool_calls' \\(2\\) exceeds turns"):
        ledger.append_rows(book, [bad])
    ledger.append_rows(book, run("a") + run("b"))
    ledger.append_rows(book, run("a", end=(False,) * 4))
    rows = ledger.read_rows(book)
    assert len(rows) == 16
    assert sum(r["solved"] for r in rows if r["arm"] == "a" and r["phase"] == "rl") == 0


def test_record_run_needs_a_ledger_and_names_the_study_by_its_file(tmp_path, monkeypatch):
    monkeypatch.setattr(arms, "REPO", tmp_path)
    c = ml_collections.ConfigDict(dict(seed=1, exp=dict(ledger="", arm="x")))
    evals = {0: dict(records=records([True, False])), 5: dict(records=records([True, True]))}
    assert arms.record_run(c, evals, [], PROV) == 0
    c.exp.ledger = "docs/results/mini.jsonl"
    assert arms.record_run(c, evals, [], PROV, command=f"{tmp_path}/experiments/rl.py --config={tmp_path}/c.py") == 4
    rows = ledger.read_rows(tmp_path / "docs/results/mini.jsonl")
    assert {(r["study"], r["arm"], r["seed"], r["command"]) for r in rows} == {
        ("mini", "x", 1, "experiments/rl.py --config=c.py")}          # a sweep's absolute paths, made relative


def test_section_numbers_by_hand():
    rows = run("a") + run("b", end=(False, False, True, False), diff=0.05)
    text = results_md.study_section("s", rows, None, samples=200, level=0.95, seed=0)
    lines = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| a") or
             line.startswith("| b")}
    # arm a: 1/4 solved after SFT, 3/4 after RL, paired gain +0.5; effort per solved RL episode: tokens
    # 30, 31, 32 (passes 0, 0, 1 of tasks 0, 1, 0) -> 31.0; one call, one turn
    assert "| 0.250 [" in lines["a"] and "| 0.750 [" in lines["a"] and "| +0.500 [" in lines["a"]
    assert "31.000 / 1.000 / 1.000" in lines["a"] and "| 0.01 |" in lines["a"]
    assert "| +0.000 [+0.000, +0.000] |" in lines["b"] and "| 0.05 |" in lines["b"]
    assert "Provenance:" in text and "experiments/rl.py --config=configs/rl_tiny.py" in text


def test_the_sweep_labels_every_arm_and_shares_one_sft():
    settings, runs = load_sweep(pathlib.Path(__file__).resolve().parents[2] / "configs/sweeps/router_replay.py")
    assert len({r["exp.arm"] for r in runs}) == len(runs) == 9
    assert settings["BASE_OVERRIDES"]["exp.sft.init_from"] and settings["BASE_OVERRIDES"]["exp.ledger"]


def test_arms_of_a_group_are_compared_with_its_first():
    rows = run("g: base", end=(False, True, True, False)) + run("g: better") + run("solo")
    pairs = arms.versus_first(rows, samples=200, level=0.95, seed=0)
    # better solves t0 pass 0 where base does not: +1 of 4 paired units
    assert pairs == [{"arm": "g: better", "against": "base", "post-RL success diff [paired CI]": pairs[0][
        "post-RL success diff [paired CI]"], "units": "4"}]
    assert pairs[0]["post-RL success diff [paired CI]"].startswith("+0.250 [")


def test_divergence_is_the_first_non_finite_or_exploding_step():
    steps = [dict(phase="rl", step=i + 1, grad_norm=1.0 + 0.1 * (i % 3), loss=0.1, reward_mean=0.5) for i in range(30)]
    assert arms.diverged_at(steps) is None
    spike = [dict(r, grad_norm=11.5) if r["step"] == 17 else r for r in steps]       # > 10x the median 1.1
    assert arms.diverged_at(spike) == 17
    nan = [dict(r, loss=float("nan")) if r["step"] == 12 else r for r in spike]
    assert arms.diverged_at(nan) == 12
    s = arms.train_summary([dict(r, kl_k1=0.01) for r in spike])
    assert s["grad_norm_max"] == 11.5 and s["diverged_at"] == 17 and s["steps"] == 30
    assert s["reward_last"] == pytest.approx(0.5) and s["kl_k1"] == pytest.approx(0.01)


def test_section_shows_the_diagnostics_an_arm_logged_and_its_parallel_call_rate():
    plain = run("a")
    assert "grad norm" not in arms.section(plain, samples=200, level=0.95, seed=0)
    rows = []
    for phase_rows, par in ((run("p")[:4], (0, 0, 2, 0)), (run("p")[4:], (2, 2, 2, 0))):
        rows += [dict(r, tool_calls=3, turns=3, parallel_calls=n, train=dict(r["train"], grad_norm=1.5,
                                                                            diverged_at=None))
                 for r, n in zip(phase_rows, par)]
    for r in rows:
        ledger.validate_row(r)
    with pytest.raises(ValueError, match="less its 2 parallel calls exceeds turns"):
        ledger.validate_row(dict(rows[2], turns=0))
    table = arms.section(rows, samples=200, level=0.95, seed=0)
    # after SFT 2 of 12 calls were parallel, after RL 6 of 12: +0.333, paired over the same tasks and passes
    assert "| 1.5 | - |" in table                     # grad norm (3 significant digits), no divergence
    assert "0.167 -> 0.500 (+0.333 [" in table


def test_a_line_through_points_by_hand():
    f = fit.linear_fit([1.0, 2.0, 3.0, float("nan")], [3.0, 5.0, 7.0, 1.0])
    assert f["points"] == 3                     # the NaN point is dropped
    assert (f["slope"], f["intercept"], f["r"]) == pytest.approx((2.0, 1.0, 1.0))
    assert (f["ci_lo"], f["ci_hi"]) == pytest.approx((2.0, 2.0))    # no residual: a zero-width interval
    # x 1..4, y 1,0,1,0: slope -1/5, intercept 1, residuals .2 -.6 .6 -.2 (sum of squares .8), SE^2 = (.8/2)/5,
    # t(2 df, 97.5%) = 4.30265
    noisy = fit.linear_fit([1, 2, 3, 4], [1.0, 0.0, 1.0, 0.0])
    half = 4.302653 * (0.4 / 5) ** 0.5
    assert (noisy["slope"], noisy["intercept"]) == pytest.approx((-0.2, 1.0))
    assert (noisy["ci_lo"], noisy["ci_hi"]) == pytest.approx((-0.2 - half, -0.2 + half), rel=1e-6)
    assert fit.linear_fit([1, 2], [1, 2])["slope"] is None                 # fewer than 3 points
    assert fit.linear_fit([1, 1, 1], [1, 2, 3])["slope"] is None           # x does not vary


def test_runs_from_pretraining_budgets_get_a_fit_on_their_start_loss():
    rows = []
    # (seed, budget, loss, post-RL solved of 4): success falls by 0.25 per unit of loss, exactly
    for seed, budget, loss, k in ((0, 0, 5.0, 0), (0, 100, 4.0, 1), (0, 400, 3.0, 2), (1, 0, 5.0, 0), (1, 400, 2.0, 3)):
        for r in run(f"budget: {budget}", seed=seed, end=tuple(i < k for i in range(4))):
            rows.append(dict(r, init=dict(checkpoint=f"runs/pt/seed{seed}/checkpoints", step=budget, eval_loss=loss,
                                          seed=seed)))
    for r in rows:
        ledger.validate_row(r)
    pts = fit.runs(rows)
    assert [(p["seed"], p["step"], p["post-RL success"]) for p in pts] == [
        (0, 0, 0.0), (0, 100, 0.25), (0, 400, 0.5), (1, 0, 0.0), (1, 400, 0.75)]
    text = results_md.study_section("s", rows, None, samples=200, level=0.95, seed=0)
    line = next(ln for ln in text.splitlines() if ln.startswith("| post-RL success |"))
    assert "| -0.250 [-0.250, -0.250] |" in line and "| 1.250 |" in line and "| -1.000 |" in line and "| 5 |" in line
    assert "t CI over runs" in text
    assert "| 0 | budget: 0 | 0 | 5.0000 |" in text        # the runs' table: seed, arm, start step, its loss
    assert not fit.has_init_loss(run("a"))               # a study without starts keeps its old section


def test_the_pretraining_sweep_starts_each_arm_from_a_budget_with_its_own_sft():
    root = pathlib.Path(__file__).resolve().parents[2]
    settings, runs = load_sweep(root / "configs/sweeps/pretrain_rl.py")
    budgets = tuple(load_config_file(root / "configs/pretrain_rl.py").train.save_steps)
    assert [r["model.init_step"] for r in runs] == list(budgets) and budgets[0] == 0 and len(budgets) >= 4
    assert len({r["exp.arm"] for r in runs}) == len(runs)
    assert "exp.sft.init_from" not in settings["BASE_OVERRIDES"]      # each start gets its own SFT
    assert settings["BASE_OVERRIDES"]["model.init_checkpoint"].startswith(
        load_config_file(root / "configs/pretrain_rl.py").train.output_dir)
