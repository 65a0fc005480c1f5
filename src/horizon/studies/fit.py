"""Pretraining -> RL (docs/SPEC.md §7; docs/RESULTS.md "pretrain_rl"): a straight line through each RL run's
outcome against the held-out pretraining loss of the checkpoint it started from (arm rows that carry an
``init`` record with ``eval_loss``, `horizon.studies.arms.init_record`), with a percentile bootstrap CI
of the slope over runs (a run = one seed x budget: it brings its loss and its outcome together, so the
CI covers run-to-run variation of SFT + RL, the task sample included)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from horizon.eval.report import markdown_table
from horizon.studies.results_fmt import ci, num, signed


def _success(rows: Sequence[dict], phase: str) -> float:
    sub = [r for r in rows if r["phase"] == phase]
    return float(np.mean([bool(r["solved"]) for r in sub])) if sub else float("nan")


# a run's outcome -> how it is read from the run's rows
OUTCOMES: dict[str, Callable[[Sequence[dict]], float]] = {
    "post-RL success": lambda rs: _success(rs, "rl"),
    "post-SFT success": lambda rs: _success(rs, "sft"),
    "RL gain": lambda rs: _success(rs, "rl") - _success(rs, "sft"),
    "train reward (last quarter)": lambda rs: float(rs[0]["train"].get("reward_last", float("nan"))),
}


def has_init_loss(rows: Sequence[dict]) -> bool:
    """Whether every row records the held-out loss of the checkpoint its run started from."""
    return bool(rows) and all("eval_loss" in (r.get("init") or {}) for r in rows)


def runs(rows: Sequence[dict]) -> list[dict]:
    """One dict per (seed, arm) run: seed, arm, start step, start loss and every `OUTCOMES` value."""
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault((r["seed"], r["arm"]), []).append(r)
    out = []
    for (seed, arm), rs in by.items():
        init = rs[0]["init"]
        out.append(dict(seed=int(seed), arm=arm, step=int(init["step"]), loss=float(init["eval_loss"]),
                        **{k: f(rs) for k, f in OUTCOMES.items()}))
    return sorted(out, key=lambda d: (d["seed"], d["step"]))


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line; slope NaN when x does not vary."""
    dx = x - x.mean()
    den = float(dx @ dx)
    if den <= 0:
        return float("nan"), float("nan")
    slope = float(dx @ (y - y.mean()) / den)
    return slope, float(y.mean() - slope * x.mean())


def linear_fit(x: Sequence[float], y: Sequence[float], samples: int = 2000, level: float = 0.95,
               seed: int = 0) -> dict:
    """y ~ slope * x + intercept by least squares, Pearson's r, and the slope's percentile bootstrap CI
    (points resampled with replacement; draws whose x does not vary are left out). NaN points are
    dropped first. Returns dict(slope, intercept, r, ci_lo, ci_hi, points); the values are None with
    fewer than 3 points or an x that does not vary."""
    xy = np.array([(a, b) for a, b in zip(x, y) if np.isfinite(a) and np.isfinite(b)], float).reshape(-1, 2)
    out = dict(slope=None, intercept=None, r=None, ci_lo=None, ci_hi=None, points=len(xy))
    if len(xy) < 3:
        return out
    slope, icpt = _line(xy[:, 0], xy[:, 1])
    if not np.isfinite(slope):
        return out
    sy = float(xy[:, 1].std())
    r = float(np.corrcoef(xy[:, 0], xy[:, 1])[0, 1]) if sy > 0 else 0.0
    rng = np.random.default_rng(seed)
    draws = [_line(*xy[idx].T)[0] for idx in rng.integers(0, len(xy), (samples, len(xy)))]
    draws = np.array([d for d in draws if np.isfinite(d)])
    q = (1.0 - level) / 2
    lo, hi = (float(np.quantile(draws, q)), float(np.quantile(draws, 1 - q))) if len(draws) else (None, None)
    return dict(out, slope=slope, intercept=icpt, r=r, ci_lo=lo, ci_hi=hi)


def section(rows: Sequence[dict], *, samples: int, level: float, seed: int) -> str:
    """The runs (seed, start step, its held-out loss, each outcome) and, per outcome, the fit on the loss."""
    pts = runs(rows)
    table = markdown_table([{"seed": p["seed"], "arm": p["arm"], "start step": p["step"],
                             "held-out loss at start": f"{p['loss']:.4f}",
                             **{k: num(p[k]) for k in OUTCOMES}} for p in pts])
    fits = []
    for k in OUTCOMES:
        f = linear_fit([p["loss"] for p in pts], [p[k] for p in pts], samples, level, seed)
        fits.append({"outcome": k, "slope per unit of loss [CI over runs]": f"{signed(f['slope'])} "
                     f"{ci(f['ci_lo'], f['ci_hi'], signed)}", "intercept": num(f["intercept"]),
                     "Pearson r": num(f["r"]), "runs": num(f["points"])})
    return ("\n**Each run against the held-out loss of the checkpoint it started from**\n\n" + table
            + "\n\n**Least-squares fits on that loss** (a negative slope: a lower pretraining loss, a higher "
              "outcome)\n\n" + markdown_table(fits) + "\n")
