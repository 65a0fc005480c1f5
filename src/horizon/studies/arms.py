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
from horizon.studies import fit, ledger
from horizon.studies.gains import paired_gain, success_ci
from horizon.studies.results_fmt import ci, num, seeds_cell, signed
from horizon.train.checkpoint import init_checkpoint_step, restore_meta
from horizon.utils.provenance import REPO

# per-step RL metrics averaged over a run's steps (the reward, the sampler/trainer mismatch, the update's size
# and the KL to the reference policy) -> the section's column headers; a column shows where an arm has it
TRAIN_KEYS = {"reward_mean": "train reward", "sampler_logprob_diff": "log-prob gap (mean)",
              "sampler_logprob_diff_max": "log-prob gap (max)", "routing/own_vs_sampler": "routing differs: own",
              "routing/trained_vs_sampler": "routing differs: trained", "grad_norm": "grad norm",
              "kl_k1": "KL to ref (k1)"}
# over the steps: the largest grad norm, the reward of the last quarter, the step where it diverged (if it did)
EXTREMES = {"grad_norm_max": "grad norm (max)", "reward_last": "train reward (last quarter)",
            "diverged_at": "diverged at step"}
DIVERGENCE_FACTOR = 10.0      # a grad norm this many times the median of the first steps counts as divergence
DIVERGENCE_BASE_STEPS = 10


def diverged_at(steps: Sequence[dict]) -> int | None:
    """The first RL step whose loss or grad norm is not finite, or whose grad norm exceeds
    `DIVERGENCE_FACTOR` times the median of the first `DIVERGENCE_BASE_STEPS` steps; None if none."""
    norms = [float(r.get("grad_norm", np.nan)) for r in steps]
    base = float(np.median(norms[:DIVERGENCE_BASE_STEPS])) if norms else np.nan
    for r, g in zip(steps, norms):
        if not (np.isfinite(g) and np.isfinite(float(r.get("loss", 0.0)))) or g > DIVERGENCE_FACTOR * base:
            return int(r.get("step", 0))
    return None


def train_summary(records: Sequence[dict]) -> dict:
    """Over a run's RL step records (metrics.jsonl, phase ``rl``): the means of the `TRAIN_KEYS` they hold,
    `EXTREMES` (where the grad norm is logged) and the number of steps."""
    steps = [r for r in records if r.get("phase") == "rl"]
    out = {k: float(np.mean([r[k] for r in steps])) for k in TRAIN_KEYS if steps and all(k in r for r in steps)}
    if steps and all("grad_norm" in r for r in steps):
        out["grad_norm_max"] = float(np.max([r["grad_norm"] for r in steps]))
        out["reward_last"] = float(np.mean([r["reward_mean"] for r in steps[-max(1, len(steps) // 4):]]))
        out["diverged_at"] = diverged_at(steps)
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
                             parallel_calls=int(r.get("parallel_calls", 0)), turns=int(r["turns"]), train=train,
                             provenance=provenance))
    return rows


def ledger_file(c) -> pathlib.Path | None:
    """`exp.ledger` relative to the repository root; None where it is "" (no study)."""
    path = str(c.exp.get("ledger", "") or "")
    return REPO / path if path else None


def init_record(c) -> dict:
    """Where a run started, for its rows: `model.init_checkpoint` (repository-relative), its step and the held-out
    loss saved with that step (`train.save_steps`: a pretraining budget's); {} for a fresh init or an HF start."""
    m = c.get("model") or {}
    src = str(m.get("init_checkpoint", "") or "")
    if not src:
        return {}
    step = init_checkpoint_step(m)
    meta = restore_meta(src, step)
    path = str(pathlib.Path(src).resolve()).replace(f"{REPO}/", "")
    kept = {k: meta[k] for k in ("eval_loss", "seed") if k in meta}      # the held-out loss; the run's seed
    return dict(checkpoint=path, step=int(step), **kept)


def record_run(c, evals: dict, records: Sequence[dict], provenance: dict, **extra) -> int:
    """Append a finished run's rows to its ledger (`ledger_file`); the study is the ledger's stem and the
    arm `exp.arm`. A rerun of an arm and seed replaces its rows (`ledger.read_rows` keeps the last)."""
    book = ledger_file(c)
    if book is None or not evals:
        return 0
    if "command" in extra:          # repository-relative paths (a sweep passes absolute ones)
        extra["command"] = str(extra["command"]).replace(f"{REPO}/", "")
    start = init_record(c)
    if start:
        extra["init"] = start
    rows = run_rows(evals, records, study=book.stem, arm=str(c.exp.arm), seed=int(c.seed), provenance=provenance,
                    **extra)
    return ledger.append_rows(book, rows)


def _effort(rows: Sequence[dict]) -> str:
    solved = [r for r in rows if r["solved"]]
    if not solved:
        return "n/a"
    return " / ".join(num(float(np.mean([r[k] for r in solved]))) for k in ("completion_tokens", "tool_calls", "turns"))


def _diagnostic(trains: Sequence[dict], key: str) -> str:
    """A diagnostic's cell: the mean over an arm's seeds (3 significant digits: the mismatch is often ~1e-5);
    ``diverged_at`` lists each seed's step ("-": did not diverge)."""
    if not all(key in t for t in trains):
        return "n/a"
    if key == "diverged_at":
        return ", ".join("-" if t[key] is None else str(t[key]) for t in trains)
    return f"{float(np.mean([t[key] for t in trains])):.3g}"


def _parallel_rate(by: dict, *, samples: int, level: float, seed: int) -> str:
    """Share of tool calls made in multi-call turns after SFT and after RL, and RL's change with its paired CI."""
    rate = lambda rs: sum(r["parallel_calls"] for r in rs) / max(1, sum(r["tool_calls"] for r in rs))  # noqa: E731
    g = paired_gain(by["rl"], by["sft"], "parallel_rate", samples, level, seed)
    return f"{num(rate(by['sft']))} -> {num(rate(by['rl']))} ({signed(g['diff'])} {ci(g['ci_lo'], g['ci_hi'], signed)})"


def section(rows: Sequence[dict], *, samples: int, level: float, seed: int) -> str:
    """One line per arm (in ledger order): episodes, seeds, post-SFT and post-RL success with CIs, the
    paired RL gain, tokens / tool calls / turns per solved episode after RL, the diagnostics any arm logged
    (`TRAIN_KEYS`, `EXTREMES`: means over the arm's seeds, 3 significant digits: the mismatch is often ~1e-5)
    and, where an arm made parallel calls, the parallel-call rate after SFT and after RL. Where every run
    started from a checkpoint with a held-out loss, `fit.section` follows (pretraining -> RL)."""
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    labels = {**TRAIN_KEYS, **EXTREMES}
    columns = [k for k in labels if any(k in r["train"] for r in rows)]
    parallel = all("parallel_calls" in r for r in rows) and any(r["parallel_calls"] for r in rows)
    header = ["arm", "episodes", "seeds", "post-SFT success", "post-RL success", "RL gain [paired CI]",
              "tokens / calls / turns per solved (RL)", *(labels[k] for k in columns)]
    header += ["parallel-call rate, SFT -> RL (change [paired CI])"] if parallel else []
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
        diag = [_diagnostic(trains, k) for k in columns]
        lines.append([arm, num(len(by["rl"])), seeds_cell(sorted({r["seed"] for r in sub})), cell["sft"], cell["rl"],
                      f"{signed(g['diff'])} {ci(g['ci_lo'], g['ci_hi'], signed)}", _effort(by["rl"]), *diag]
                     + ([_parallel_rate(by, samples=samples, level=level, seed=seed)] if parallel else []))
    out = markdown_table([dict(zip(header, line)) for line in lines]) + "\n"
    pairs = versus_first(rows, samples=samples, level=level, seed=seed)
    if pairs:
        out += ("\n**Post-RL success against the first arm of its group** (a label's part before \": \"; "
                "paired over seeds x tasks x passes)\n\n" + markdown_table(pairs) + "\n")
    if fit.has_init_loss(rows):         # runs started from checkpoints with a held-out loss: pretraining -> RL
        out += fit.section(rows, level=level)
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
