"""What a study's ledger rows say (docs/SPEC.md §7): pure numpy functions of `horizon.studies.ledger`
rows, checkable by hand on a few synthetic episodes.

- `success_ci`: mean success with the bootstrap CI of `horizon.studies.selfsum_metrics.bootstrap_ci`
  (tasks resampled within each seed, each with all its passes);
- `paired_gain`: mean(a) - mean(b) over the episodes both sides ran (same seed, task and pass: the
  post-RL vs the post-SFT policy, or oracle summaries vs the policy's own), with a CI from the same
  resampling applied to the pairs, so the noise the two sides share cancels;
- `parallel_rate` (a `paired_gain` metric): the share of tool calls made in multi-call turns (parallel calls);
- `carry`: the share of seen facts a compaction kept (needed facts: higher is better; distractors:
  lower is better, a summary that keeps everything is not selective);
- `phase_row`: one strategy x phase's numbers for the table of docs/RESULTS.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from horizon.studies.selfsum_metrics import bootstrap_ci

METRICS = ("success", "needed_carry", "distractor_carry", "parallel_rate")
_CARRY_FIELDS = {"needed_carry": "needed", "distractor_carry": "distractors"}


def _ratio(num: float, den: float) -> float | None:
    return float(num / den) if den else None


def success_ci(rows: Sequence[dict], samples: int = 2000, level: float = 0.95,
               seed: int = 0) -> tuple[float | None, float | None, float | None]:
    """(mean success, CI low, CI high) over `rows`; all None when there are none."""
    if not rows:
        return None, None, None
    by_seed: dict = {}
    for r in rows:
        by_seed.setdefault(r["seed"], {}).setdefault(r["task_id"], []).append(float(bool(r["solved"])))
    lo, hi = bootstrap_ci(by_seed, samples=samples, level=level, seed=seed)
    return sum(bool(r["solved"]) for r in rows) / len(rows), lo, hi


def carry(rows: Sequence[dict], kind: str) -> float | None:
    """sum `<kind>_kept` / sum `<kind>_seen` over `rows` (kind "needed" or "distractors"); None when
    no compaction saw such a fact."""
    if kind not in ("needed", "distractors"):
        raise ValueError(f"carry kind must be 'needed' or 'distractors', got {kind!r}")
    return _ratio(sum(r[f"{kind}_kept"] for r in rows), sum(r[f"{kind}_seen"] for r in rows))


def _num_den(r: dict, metric: str) -> tuple[float, float]:
    """One episode's contribution to `metric` as a ratio of sums (success: solved / 1)."""
    if metric == "success":
        return float(bool(r["solved"])), 1.0
    if metric == "parallel_rate":
        return float(r["parallel_calls"]), float(r["tool_calls"])
    kind = _CARRY_FIELDS[metric]
    return float(r[f"{kind}_kept"]), float(r[f"{kind}_seen"])


def _units(rows: Sequence[dict], side: str) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    for r in rows:
        u = (r["seed"], r["task_id"], r["pass_index"])
        if u in out:
            raise ValueError(f"paired_gain: side {side} has two rows for (seed, task_id, pass_index) {u}")
        out[u] = r
    return out


def _diff(sums: np.ndarray) -> np.ndarray:
    """a - b from [..., (num_a, den_a, num_b, den_b)] sums; NaN where a denominator is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        d = sums[..., 0] / sums[..., 1] - sums[..., 2] / sums[..., 3]
    return np.where((sums[..., 1] > 0) & (sums[..., 3] > 0), d, np.nan)


def paired_gain(rows_a: Sequence[dict], rows_b: Sequence[dict], metric: str = "success", samples: int = 2000,
                level: float = 0.95, seed: int = 0) -> dict:
    """mean(a) - mean(b) of `metric` over the (seed, task_id, pass_index) units both sides have, with
    a percentile bootstrap CI: each replicate draws, within every seed, that seed's paired tasks with
    replacement (a drawn task brings all its passes on both sides). Success is the mean of solved;
    a carry is the ratio of sums (kept / seen) per side, so episodes that saw nothing count as units
    but add nothing. Replicates whose draw saw nothing on a side are left out of the CI.

    Returns dict(diff, ci_lo, ci_hi, units, seeds): units paired, their sorted seeds; diff and CI
    None when a side's ratio has a zero denominator (or nothing pairs)."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    a, b = _units(rows_a, "a"), _units(rows_b, "b")
    common = [u for u in a if u in b]
    seeds = sorted({u[0] for u in common})
    out = dict(diff=None, ci_lo=None, ci_hi=None, units=len(common), seeds=seeds)
    tasks: dict = {}                 # seed -> task_id -> summed (num_a, den_a, num_b, den_b)
    for u in common:
        t = tasks.setdefault(u[0], {}).setdefault(u[1], np.zeros(4))
        t += (*_num_den(a[u], metric), *_num_den(b[u], metric))
    per_seed = [np.stack(list(ts.values())) for ts in tasks.values()]
    total = sum((t.sum(0) for t in per_seed), np.zeros(4))
    diff = _diff(total)
    if not common or np.isnan(diff):
        return out
    rng = np.random.default_rng(seed)
    reps = np.zeros((samples, 4))
    for t in per_seed:
        reps += t[rng.integers(0, len(t), (samples, len(t)))].sum(1)
    d = _diff(reps)
    d = d[~np.isnan(d)]
    if not len(d):
        return dict(out, diff=float(diff))
    q = (1.0 - level) / 2
    return dict(out, diff=float(diff), ci_lo=float(np.quantile(d, q)), ci_hi=float(np.quantile(d, 1 - q)))


def phase_row(rows: Sequence[dict], samples: int = 2000, level: float = 0.95, seed: int = 0) -> dict:
    """One strategy x phase's numbers over its rows (all seeds): episodes, seeds (sorted), success
    with its CI, compaction-caused errors (count and share of episodes), needed and distractor carry,
    tokens per summary, summaries per episode and per solved episode (None where undefined)."""
    if not rows:
        raise ValueError("phase_row needs at least one row")
    n = len(rows)
    success, lo, hi = success_ci(rows, samples, level, seed)
    solved = [r for r in rows if r["solved"]]
    summaries = sum(r["summaries"] for r in rows)
    errors = sum(bool(r["compaction_error"]) for r in rows)
    return dict(episodes=n, seeds=sorted({r["seed"] for r in rows}), success=success, ci_lo=lo, ci_hi=hi,
                compaction_errors=errors, compaction_error_rate=errors / n,
                needed_carry=carry(rows, "needed"), distractor_carry=carry(rows, "distractors"),
                tokens_per_summary=_ratio(sum(r["summary_tokens"] for r in rows), summaries),
                summaries_per_episode=summaries / n,
                summaries_per_solved=_ratio(sum(r["summaries"] for r in solved), len(solved)))
