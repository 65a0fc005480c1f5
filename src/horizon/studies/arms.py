"""A study whose arms are RL runs (docs/SPEC.md §7; docs/RESULTS.md "router_replay"): one experiments/rl.py
run per arm of a sweep (configs/sweeps/), every arm from one SFT checkpoint (`exp.sft.init_from`).

With `exp.ledger` set, a run appends ledger rows (schema ``arm``, `horizon.studies.ledger`) of its held-out
episodes at step 0 (phase ``sft``) and after RL (phase ``rl``), labelled `exp.arm`, each carrying the
run's training diagnostics (`train_summary`: means over its RL steps). `section` is the study's part of
docs/RESULTS.md: per arm, success after SFT and after RL with the bootstrap CI over tasks, the RL gain
with its paired CI (`gains.paired_gain`), effort per solved episode after RL, and the diagnostics.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

import numpy as np

from horizon.eval.report import markdown_table
from horizon.studies import ledger
from horizon.studies.gains import paired_gain, success_ci
from horizon.studies.results_fmt import ci, num, seeds_cell, signed
from horizon.utils.provenance import REPO

# per-step RL metrics averaged over a run's steps: the reward and the sampler/trainer mismatch
TRAIN_KEYS = ("reward_mean", "sampler_logprob_diff", "sampler_logprob_diff_max", "routing/own_vs_sampler",
              "routing/trained_vs_sampler")
TRAIN_LABELS = ("train reward", "log-prob gap (mean)", "log-prob gap (max)", "routing differs: own",
                "routing differs: trained")     # the section's headers of TRAIN_KEYS (means over RL steps)


def train_summary(records: Sequence[dict]) -> dict:
    """Means over a run's RL step records (metrics.jsonl, phase ``rl``) of the `TRAIN_KEYS` they hold,
    and the number of steps."""
    steps = [r for r in records if r.get("phase") == "rl"]
    out = {k: float(np.mean([r[k] for r in steps])) for k in TRAIN_KEYS if steps and all(k in r for r in steps)}
    return dict(out, steps=len(steps))


def run_rows(evals: dict, records: Sequence[dict], *, study: str, arm: str, seed: int, provenance: dict,
             **extra) -> list[dict]:
    """Rows of one run: the episodes of its first eval (step 0: the SFT policy) and its last (after RL),
    from `evals` ({step: eval with ``records``, `loop.evaluate`}); `extra` (e.g. ``command``) on each."""
    train = train_summary(records)
    rows = []
    for phase, step in (("sft", min(evals)), ("rl", max(evals))):
        for r in evals[step]["records"]:
            rows.append(dict(extra, schema="arm", study=study, seed=int(seed), arm=arm, phase=phase, step=int(step),
                             task_id=str(r["task_id"]), pass_index=int(r["pass_index"]), solved=bool(r["solved"]),
                             completion_tokens=int(r["completion_tokens"]), tool_calls=int(r["tool_calls"]),
                             turns=int(r["turns"]), train=train, provenance=provenance))
    return rows


def ledger_file(c) -> pathlib.Path | None:
    """`exp.ledger` relative to the repository root; None where it is "" (no study)."""
    path = str(c.exp.get("ledger", "") or "")
    return REPO / path if path else None


def record_run(c, evals: dict, records: Sequence[dict], provenance: dict, **extra) -> int:
    """Append a finished run's rows to its ledger (`ledger_file`); the study is the ledger's stem and the
    arm `exp.arm`. A rerun of an arm and seed replaces its rows (`ledger.read_rows` keeps the last)."""
    book = ledger_file(c)
    if book is None or not evals:
        return 0
    if "command" in extra:          # repository-relative paths (a sweep passes absolute ones)
        extra["command"] = str(extra["command"]).replace(f"{REPO}/", "")
    rows = run_rows(evals, records, study=book.stem, arm=str(c.exp.arm), seed=int(c.seed), provenance=provenance,
                    **extra)
    return ledger.append_rows(book, rows)


def _effort(rows: Sequence[dict]) -> str:
    solved = [r for r in rows if r["solved"]]
    if not solved:
        return "n/a"
    return " / ".join(num(float(np.mean([r[k] for r in solved]))) for k in ("completion_tokens", "tool_calls", "turns"))


def section(rows: Sequence[dict], *, samples: int, level: float, seed: int) -> str:
    """One line per arm (in ledger order): episodes, seeds, post-SFT and post-RL success with CIs, the
    paired RL gain, tokens / tool calls / turns per solved episode after RL, and `TRAIN_KEYS`' means
    (averaged over the arm's seeds; 3 significant digits: the mismatch is often ~1e-5)."""
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    header = ["arm", "episodes", "seeds", "post-SFT success", "post-RL success", "RL gain [paired CI]",
              "tokens / calls / turns per solved (RL)", *TRAIN_LABELS]
    lines = []
    for arm in arms:
        sub = [r for r in rows if r["arm"] == arm]
        by = {p: [r for r in sub if r["phase"] == p] for p in ("sft", "rl")}
        cell = {}
        for p, rs in by.items():
            m, lo, hi = success_ci(rs, samples, level, seed)
            cell[p] = f"{num(m)} {ci(lo, hi)}"
        g = paired_gain(by["rl"], by["sft"], "success", samples, level, seed)
        trains = list({r["seed"]: r["train"] for r in sub}.values())
        diag = [f"{float(np.mean([t[k] for t in trains])):.3g}" if all(k in t for t in trains) else "n/a"
                for k in TRAIN_KEYS]
        lines.append([arm, num(len(by["rl"])), seeds_cell(sorted({r["seed"] for r in sub})), cell["sft"], cell["rl"],
                      f"{signed(g['diff'])} {ci(g['ci_lo'], g['ci_hi'], signed)}", _effort(by["rl"]), *diag])
    out = markdown_table([dict(zip(header, line)) for line in lines]) + "\n"
    pairs = versus_first(rows, samples=samples, level=level, seed=seed)
    if pairs:
        out += ("\n**Post-RL success against the first arm of its group** (a label's part before \": \"; "
                "paired over seeds x tasks x passes)\n\n" + markdown_table(pairs) + "\n")
    return out


def versus_first(rows: Sequence[dict], *, samples: int, level: float, seed: int) -> list[dict]:
    """Each arm's post-RL success minus that of the first arm of its group (arms labelled ``"group: name"``,
    in ledger order), with the paired bootstrap CI (`gains.paired_gain`)."""
    groups: dict[str, list[str]] = {}
    for arm in dict.fromkeys(r["arm"] for r in rows):
        if ": " in arm:
            groups.setdefault(arm.split(": ")[0], []).append(arm)
    post = lambda a: [r for r in rows if r["arm"] == a and r["phase"] == "rl"]   # noqa: E731
    out = []
    for members in groups.values():
        for arm in members[1:]:
            g = paired_gain(post(arm), post(members[0]), "success", samples, level, seed)
            out.append({"arm": arm, "against": members[0].split(": ", 1)[1],
                        "post-RL success diff [paired CI]": f"{signed(g['diff'])} {ci(g['ci_lo'], g['ci_hi'], signed)}",
                        "units": num(g["units"])})
    return out
