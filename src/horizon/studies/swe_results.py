"""The real-repository pipeline's results (docs/REAL_REPOS.md, docs/SPEC.md §7): ledger rows from
experiments/eval.py's episode records (`eval_rows`) and their section of docs/RESULTS.md
(`section`), per split (unseen instances of the train repositories, held-out repositories) and
phase (post-SFT, post-RL).

Success and the well-formed call rate (turns that were not malformed calls, over all turns) carry
the percentile bootstrap CI of `selfsum_metrics.bootstrap_ci`: tasks resampled within each seed, a
drawn task with all its passes (and, for the call rate, all its turns).
"""

from __future__ import annotations

import pathlib
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from horizon.eval.report import markdown_table
from horizon.eval.setup import task_repo
from horizon.studies.ledger import RESULTS_DIR, SWE_PHASES, SWE_SPLITS, append_rows
from horizon.studies.results_fmt import ci, num, seeds_cell
from horizon.studies.selfsum_metrics import bootstrap_ci
from horizon.utils.config import need
from horizon.utils.provenance import REPO

PHASE_LABELS = {"sft": "post-SFT", "rl": "post-RL"}
SPLIT_LABELS = {"unseen": "unseen instances of the train repositories", "heldout": "held-out repositories"}
MODES = ("solved", "malformed", "no_edit", "wrong_file", "wrong_edit", "broke_other_tests", "timeout")


def eval_rows(records: Sequence[dict], *, study: str, seed: int, phase: str, split: str,
              repo_of: Callable[[str], str], provenance: dict, **extra) -> list[dict]:
    """Ledger rows (schema ``swe``) of one policy's `harness.run_eval` records on SWE-bench tasks
    (each with `tasks.diagnosis` fields); `repo_of(task_id)` names its repository; `extra` (e.g.
    ``command``, ``checkpoint``) on every row. Validated on append."""
    return [dict(extra, schema="swe", study=study, seed=int(seed), phase=phase, split=split, task_id=r["task_id"],
                 repo=repo_of(r["task_id"]), bug_kind=str(r.get("swe_kind", "unknown")),
                 pass_index=int(r["pass_index"]), solved=bool(r["solved"]), turns=int(r["turns"]),
                 tool_calls=int(r["tool_calls"]), malformed_calls=int(r["malformed_calls"]),
                 summaries=int(r["summaries"]), failure_mode=str(r.get("swe_mode", "unknown")),
                 right_file=bool(r.get("swe_right_file", False)), right_hunk=bool(r.get("swe_right_hunk", False)),
                 end_reason=str(r.get("end_reason", "")), provenance=provenance) for r in records]


def _ci_of(rows: Sequence[dict], values: Callable[[dict], list[float]], samples: int, level: float,
           seed: int) -> tuple[float | None, float | None, float | None]:
    """(mean of all `values` of `rows`, bootstrap CI) with tasks resampled within seeds."""
    by_seed: dict = {}
    for r in rows:
        by_seed.setdefault(r["seed"], {}).setdefault(r["task_id"], []).extend(values(r))
    flat = [v for tasks in by_seed.values() for vs in tasks.values() for v in vs]
    if not flat:
        return None, None, None
    lo, hi = bootstrap_ci(by_seed, samples=samples, level=level, seed=seed)
    return float(np.mean(flat)), lo, hi


def phase_line(rows: Sequence[dict], *, samples: int, level: float, seed: int) -> dict:
    """One phase's numbers: success and the well-formed call rate with CIs, actions (tool calls) per
    episode, the share of episodes that edited the gold patch's file / a gold hunk, and how many
    episodes summarized and how many summaries they carry."""
    s = _ci_of(rows, lambda r: [float(r["solved"])], samples, level, seed)
    w = _ci_of(rows, lambda r: [1.0] * (r["turns"] - r["malformed_calls"]) + [0.0] * r["malformed_calls"],
               samples, level, seed)
    summarized = [r for r in rows if r["summaries"] > 0]
    return dict(episodes=num(len(rows)), tasks=num(len({r["task_id"] for r in rows})),
                seeds=seeds_cell(sorted({r["seed"] for r in rows})), success=f"{num(s[0])} {ci(s[1], s[2])}",
                wellformed=f"{num(w[0])} {ci(w[1], w[2])}",
                actions=num(float(np.mean([r["tool_calls"] for r in rows]))),
                right_file=num(float(np.mean([r["right_file"] for r in rows]))),
                right_hunk=num(float(np.mean([r["right_hunk"] for r in rows]))),
                summarized=f"{len(summarized)} ({num(float(np.mean([r['summaries'] for r in summarized])))})"
                if summarized else "0")


def section(rows: Sequence[dict], *, samples: int, level: float, seed: int) -> str:
    """The study's tables: per split, one line per phase (`phase_line`), then the failure modes and
    the success per bug kind of each phase."""
    out = []
    for split in SWE_SPLITS:
        sub = [r for r in rows if r["split"] == split]
        if not sub:
            continue
        phases = [p for p in SWE_PHASES if any(r["phase"] == p for r in sub)]
        lines = [dict(phase=PHASE_LABELS[p], **phase_line([r for r in sub if r["phase"] == p], samples=samples,
                                                           level=level, seed=seed)) for p in phases]
        out.append(f"### {SPLIT_LABELS[split]}\n")
        out.append(markdown_table(lines, list(lines[0]), [
            "phase", "episodes", "tasks", "seeds", f"success [{level:.0%} CI]", f"well-formed calls [{level:.0%} CI]",
            "actions / episode", "right file", "right hunk", "episodes summarized (summaries each)"]))
        modes = [dict(phase=PHASE_LABELS[p], **{m: num(c.get(m, 0)) for m in MODES})
                 for p in phases for c in [Counter(r["failure_mode"] for r in sub if r["phase"] == p)]]
        out += ["**How episodes ended** (`horizon.tasks.diagnosis` failure modes, episodes)\n",
                markdown_table(modes, ["phase", *MODES])]
        kinds = sorted({r["bug_kind"] for r in sub})
        per_kind = [dict(kind=k, **{p: _solved_of([r for r in sub if r["bug_kind"] == k and r["phase"] == p])
                                    for p in phases}) for k in kinds]
        out += ["**Solved per bug kind** (solved / episodes)\n",
                markdown_table(per_kind, ["kind", *phases], ["bug kind", *(PHASE_LABELS[p] for p in phases)])]
    return "\n".join(out)


def _solved_of(rows: Sequence[dict]) -> str:
    return f"{sum(r['solved'] for r in rows)}/{len(rows)}" if rows else "-"


def validate_ledger_config(e) -> None:
    """experiments/eval.py's `eval.ledger` / `eval.ledger_split`: a ledger takes SWE-bench episodes
    of one known split, from a JSONL path under docs/results/."""
    path = str(e.get("ledger", "") or "")
    if not path:
        return
    need(path.startswith(RESULTS_DIR + "/") and path.endswith(".jsonl"), "eval.ledger", path,
         f"must be a {RESULTS_DIR}/<study>.jsonl path (relative to the repository root)")
    need(str(e.task_source) == "swebench", "eval.ledger", path, "takes SWE-bench episodes (eval.task_source="
         "'swebench')")
    need(str(e.ledger_split) in SWE_SPLITS, "eval.ledger_split", e.ledger_split, f"must be one of {SWE_SPLITS}")


def record_eval(c, policy: str, records: Sequence[dict], tasks, provenance: dict, **extra) -> int:
    """Append one policy's `run_eval` records to `c.eval.ledger` (when set) as ``swe`` rows of phase
    `policy` (only the phases `SWE_PHASES`: the patch policies and other checkpoints are bounds, not
    results); returns the rows appended."""
    path = str(c.eval.get("ledger", "") or "")
    if not path or policy not in SWE_PHASES:
        return 0
    repos = {t.id: task_repo(t) for t in tasks}
    rows = eval_rows(records, study=pathlib.Path(path).stem, seed=int(c.seed), phase=policy,
                     split=str(c.eval.ledger_split), repo_of=repos.__getitem__, provenance=provenance, **extra)
    return append_rows(REPO / path, rows)
