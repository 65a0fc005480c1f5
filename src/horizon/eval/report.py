"""Writing eval/sweep results: JSONL records, Markdown tables and metric plots (docs/SPEC.md §7).

Every experiment writes `metrics.jsonl` (one JSON object per line); `plot_jsonl` re-plots any
numeric keys of such a file against a chosen x key (experiments/plot.py is its CLI).
"""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from horizon.tasks.diagnosis import MODES


def write_jsonl(path: str | pathlib.Path, records: Iterable[dict]) -> pathlib.Path:
    """Write `records` one JSON object per line (overwrites)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, sort_keys=True, default=_jsonable) + "\n" for r in records))
    return path


def read_jsonl(path: str | pathlib.Path) -> list[dict]:
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such JSONL file: {path}")
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not JSON: {e}") from None
    return out


def _jsonable(x: Any):
    if hasattr(x, "item"):
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


def fmt(v: Any, digits: int = 3) -> str:
    """Compact cell text: ints as is, floats with `digits` significant decimals, big numbers in e-notation."""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.{digits - 1}e}"
        return f"{v:.{digits}f}"
    return str(v)


def markdown_table(rows: Sequence[dict], columns: Sequence[str] | None = None,
                   headers: Sequence[str] | None = None) -> str:
    """GitHub Markdown table of `rows` (dicts); missing cells are blank. Columns default to the union of keys."""
    if columns is None:
        columns = []
        for r in rows:
            columns += [k for k in r if k not in columns]
    headers = list(headers) if headers is not None else list(columns)
    if len(headers) != len(columns):
        raise ValueError(f"{len(headers)} headers for {len(columns)} columns")
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r[c]) if c in r else "" for c in columns) + " |")
    return "\n".join(lines) + "\n"


def plot_jsonl(path: str | pathlib.Path, out: str | pathlib.Path, *, x: str = "step", y: Sequence[str] | None = None,
               group: str | None = None, logy: bool = False, title: str | None = None) -> pathlib.Path:
    """Plot keys `y` (default: every numeric key but `x`) against `x` from a metrics JSONL to a PNG.

    Records lacking `x` or a `y` key are skipped for that curve; `group` splits curves by a key's value
    (e.g. one curve per run or per policy).
    """
    import matplotlib  # noqa: PLC0415 - heavy, plotting only
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - heavy, plotting only

    recs = read_jsonl(path)
    if not recs:
        raise ValueError(f"{path} has no records to plot")
    num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    if y is None:
        y = sorted({k for r in recs for k, v in r.items() if k not in (x, group) and num(v)})
    y = list(y)
    if not any(x in r for r in recs):
        raise KeyError(f"x key {x!r} is in no record of {path}; keys: {sorted({k for r in recs for k in r})}")
    missing = [k for k in y if not any(k in r for r in recs)]
    if missing:
        raise KeyError(f"y keys {missing} are in no record of {path}; keys: {sorted({k for r in recs for k in r})}")
    fig, ax = plt.subplots(figsize=(6.5, 4))
    groups = sorted({str(r.get(group)) for r in recs}) if group else [None]
    for g in groups:
        sub = [r for r in recs if group is None or str(r.get(group)) == g]
        for k in y:
            pts = sorted((r[x], r[k]) for r in sub if x in r and k in r and num(r[x]) and num(r[k]))
            if pts:
                label = k if g is None else f"{k} [{group}={g}]"
                ax.plot(*zip(*pts), marker="." if len(pts) < 50 else None, label=label)
    ax.set_xlabel(x)
    ax.set_ylabel(y[0] if len(y) == 1 else "value")
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or pathlib.Path(path).name)
    fig.tight_layout()
    out = pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


# ----------------------------------------------------------------------------- reward curves
def smooth(x, w: int) -> np.ndarray:
    """Trailing moving average of `x` over `w` points (fewer at the start)."""
    x = np.asarray(x, np.float64)
    if len(x) == 0:
        return x
    w = max(1, min(w, len(x)))
    c = np.cumsum(np.insert(x, 0, 0.0))
    out = np.empty_like(x)
    for i in range(len(x)):
        lo = max(0, i - w + 1)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out


def time_to_reach(times, rewards, target: float, w: int) -> float | None:
    """The first time at which the smoothed reward reaches `target` (None if never)."""
    s = smooth(rewards, w)
    hit = np.nonzero(s >= target - 1e-9)[0]
    return float(times[hit[0]]) if len(hit) else None


def reward_at(times, rewards, t: float, w: int) -> float | None:
    """The smoothed reward at the last point at or before time `t` (None if none)."""
    s = smooth(rewards, w)
    idx = [i for i, ti in enumerate(times) if ti <= t]
    return float(s[idx[-1]]) if idx else None


def repo_rows(per_task: Sequence[dict], repo_of: dict[str, str]) -> list[dict]:
    """Per (policy, repository): tasks and mean accuracy / best_of_1 over its tasks (success per
    repository; `repo_of` maps task ids to repositories, a task missing there counts under its kind)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in per_task:
        groups.setdefault((r["policy"], repo_of.get(r["task_id"], r["kind"])), []).append(r)
    return [dict(policy=p, repo=repo, tasks=len(rs), accuracy=float(np.mean([r["accuracy"] for r in rs])),
                 best_of_1=float(np.mean([r["best_of_1"] for r in rs]))) for (p, repo), rs in groups.items()]


def rl_curve_plot(records: Sequence[dict], path: str | pathlib.Path, title: str) -> None:
    """An RL run's curves from its metrics records (experiments/rl.py's rewards.png): train reward and
    best-of-group per step, held-out success (mean +- std over passes) and best-of-passes per eval."""
    import matplotlib  # noqa: PLC0415  (plotting only where a plot is asked for)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    rl = [r for r in records if r.get("phase") == "rl"]
    ev = [r for r in records if r.get("phase") == "eval"]
    fig, ax = plt.subplots(figsize=(6, 4))
    if rl:
        s = [r["step"] for r in rl]
        ax.plot(s, [r["reward_mean"] for r in rl], ".-", alpha=0.5, label="train reward (mean)")
        ax.plot(s, [r["best_of_k"] for r in rl], ".-", alpha=0.5, label=f"train best-of-{rl[0]['group_size']}")
    if ev:
        s = [r["step"] for r in ev]
        ax.errorbar(s, [r["heldout_mean"] for r in ev], yerr=[r["heldout_std"] for r in ev], fmt="o-", capsize=3,
                    label="held-out success (mean ± std over passes)")
        ax.plot(s, [r["heldout_best_of_k"] for r in ev], "s--",
                label=f"held-out best-of-{len(ev[0]['heldout_passes'])}")
    ax.set_xlabel("RL step")
    ax.set_ylabel("reward / success")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3), ax.legend(fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


DIAG_COLS = ["policy", "bug_kind", "episodes", "solved", "right_file", "right_hunk", "files_edited", "actions",
             "summaries"]


def diagnosis_rows(records: Sequence[dict]) -> list[dict]:
    """Per (policy, bug kind) and per policy over all kinds ("all"), from the episodes of SWE-bench
    tasks (`horizon.tasks.diagnosis` fields): success, edits in the gold patch's file / near its
    hunks, files edited, tool calls and summaries per episode, and the count of each failure mode
    (``mode/<name>``). Empty when no record has a diagnosis."""
    rs = [r for r in records if "swe_mode" in r]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rs:
        for kind in (r["swe_kind"], "all"):
            groups.setdefault((r["policy"], kind), []).append(r)
    return [dict(policy=p, bug_kind=k, episodes=len(g), solved=float(np.mean([r["solved"] for r in g])),
                 right_file=float(np.mean([r["swe_right_file"] for r in g])),
                 right_hunk=float(np.mean([r["swe_right_hunk"] for r in g])),
                 files_edited=float(np.mean([r["swe_files_edited"] for r in g])),
                 actions=float(np.mean([r["tool_calls"] for r in g])),
                 summaries=float(np.mean([r["summaries"] for r in g])),
                 **{f"mode/{m}": sum(r["swe_mode"] == m for r in g) for m in MODES})
            for (p, k), g in sorted(groups.items())]


def diagnosis_md(rows: Sequence[dict]) -> str:
    """`diagnosis_rows` as a Markdown section ("" without rows)."""
    if not rows:
        return ""
    modes = [k for k in rows[0] if k.startswith("mode/")]
    return "\n## Where episodes went wrong (per bug kind)\n\n" + markdown_table(list(rows), DIAG_COLS + modes)


def best_of_k_plot(overall: Sequence[dict], path: str | pathlib.Path) -> None:
    """experiments/eval.py's best_of_k.png: each policy's pass@K against K, its mean dashed."""
    import matplotlib  # noqa: PLC0415  (plotting only where a plot is asked for)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for o in overall:
        ks = list(range(1, int(o["n"]) + 1))
        line, = ax.plot(ks, [o[f"best_of_{k}"] for k in ks], marker="o", label=f"{o['policy']} best-of-K")
        ax.axhline(o["accuracy"], ls="--", color=line.get_color(), alpha=0.7, label=f"{o['policy']} mean")
    ax.set_xlabel("K (passes)"), ax.set_ylabel("accuracy"), ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3), ax.legend(fontsize=8), ax.set_title("mean vs best-of-K (unbiased pass@K)")
    fig.tight_layout(), fig.savefig(path, dpi=100), plt.close(fig)
