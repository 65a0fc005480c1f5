"""Pretraining -> RL (docs/SPEC.md §7; docs/RESULTS.md "pretrain_rl"): a straight line through each RL run's
outcome against the held-out pretraining loss of the checkpoint it started from (arm rows that carry an
``init`` record with ``eval_loss``, `horizon.studies.arms.init_record`). A run (one seed x budget) is one
point, so the slope's CI is the least-squares one over runs: standard error from the residuals, Student's t
with n - 2 degrees of freedom. It covers run-to-run variation of SFT + RL, the task sample included; with the
few runs a study has, a bootstrap over them would be far too narrow (3 collinear-looking points give a
zero-width interval)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats

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


def linear_fit(x: Sequence[float], y: Sequence[float], level: float = 0.95) -> dict:
    """y ~ slope * x + intercept by least squares, Pearson's r, and the slope's `level` CI: slope -/+
    t(n - 2) * SE, SE^2 = (residual sum of squares / (n - 2)) / sum (x - mean x)^2. NaN points are dropped
    first. Returns dict(slope, intercept, r, ci_lo, ci_hi, points); the values are None with fewer than 3
    points or an x that does not vary."""
    xy = np.array([(a, b) for a, b in zip(x, y) if np.isfinite(a) and np.isfinite(b)], float).reshape(-1, 2)
    out = dict(slope=None, intercept=None, r=None, ci_lo=None, ci_hi=None, points=len(xy))
    if len(xy) < 3:
        return out
    xs, ys = xy[:, 0], xy[:, 1]
    dx = xs - xs.mean()
    sxx = float(dx @ dx)
    if sxx <= 0:
        return out
    slope = float(dx @ (ys - ys.mean()) / sxx)
    icpt = float(ys.mean() - slope * xs.mean())
    resid = ys - (icpt + slope * xs)
    se = float(np.sqrt(resid @ resid / (len(xy) - 2) / sxx))
    half = float(stats.t.ppf(0.5 + level / 2, len(xy) - 2)) * se
    r = float(np.corrcoef(xs, ys)[0, 1]) if float(ys.std()) > 0 else 0.0
    return dict(out, slope=slope, intercept=icpt, r=r, ci_lo=slope - half, ci_hi=slope + half)


def section(rows: Sequence[dict], *, level: float) -> str:
    """The runs (seed, start step, its held-out loss, each outcome) and, per outcome, the fit on the loss."""
    pts = runs(rows)
    table = markdown_table([{"seed": p["seed"], "arm": p["arm"], "start step": p["step"],
                             "held-out loss at start": f"{p['loss']:.4f}",
                             **{k: num(p[k]) for k in OUTCOMES}} for p in pts])
    fits = []
    for k in OUTCOMES:
        f = linear_fit([p["loss"] for p in pts], [p[k] for p in pts], level)
        fits.append({"outcome": k, "slope per unit of loss [t CI over runs]": f"{signed(f['slope'])} "
                     f"{ci(f['ci_lo'], f['ci_hi'], signed)}", "intercept": num(f["intercept"]),
                     "Pearson r": num(f["r"]), "runs": num(f["points"])})
    return ("\n**Each run against the held-out loss of the checkpoint it started from**\n\n" + table
            + "\n\n**Least-squares fits on that loss** (a negative slope: a lower pretraining loss, a higher "
              "outcome)\n\n" + markdown_table(fits) + "\n")
