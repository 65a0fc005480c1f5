"""Sweeps: run an experiment script once per config override and tabulate the runs (docs/SPEC.md §7).

The machinery behind experiments/sweep.py (its docstring describes sweep files and outputs).
Paths in a sweep file (SCRIPT, CONFIG) are relative to `root`, the repository the sweep runs in.
Each member is its own tracked run: a member whose config has an ``exp.wandb`` block gets
``exp.wandb.group=<sweep NAME>`` and ``exp.wandb.name=<run name>`` (unless the sweep sets them),
and every `summary.jsonl` row and `sweep_run.json` carries the member's `provenance`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import time

from horizon.eval.report import markdown_table, read_jsonl, write_jsonl
from horizon.utils import cli
from horizon.utils.config import dump_config
from horizon.utils.progress import progress, say
from horizon.utils.provenance import Provenance, git_state

DEFAULTS = dict(SCRIPT="experiments/pretrain.py", CONFIG="configs/tiny.py", BASE_OVERRIDES={},
                OUT_FIELD="train.output_dir", EXTRA_ARGS=(), PLOT=("step", "loss"), NAME=None)


def git_commit(cwd: str | pathlib.Path) -> str:
    """`git rev-parse HEAD`, or "unknown" outside a git repo / without git (`provenance.git_state`)."""
    return git_state(cwd)[0]


def load_sweep(path: str | pathlib.Path) -> tuple[dict, list[dict]]:
    """(settings, list of override dicts) from a sweep file (module docstring)."""
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"sweep file not found: {path}")
    spec = importlib.util.spec_from_file_location(f"_horizon_sweep_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not hasattr(mod, "get_sweep"):
        raise AttributeError(f"{path} defines no get_sweep()")
    runs = mod.get_sweep()
    if not isinstance(runs, (list, tuple)) or not runs or not all(isinstance(r, dict) for r in runs):
        raise TypeError(f"{path}: get_sweep() must return a non-empty list of override dicts, got {runs!r}")
    retired = [k for k in ("OVERRIDE_STYLE", "CONFIG_FLAG", "OUT_FLAG") if hasattr(mod, k)]
    if retired:
        raise ValueError(f"{path}: {retired} are gone: every script takes --config.a.b=v; name the run-dir field "
                         "with OUT_FIELD")
    settings = {k: getattr(mod, k, v) for k, v in DEFAULTS.items()}
    settings["NAME"] = settings["NAME"] or path.stem
    return settings, [dict(r) for r in runs]


def _safe_name(text: str) -> str:
    """`text` as one path component: characters outside [A-Za-z0-9_.=+-] become "_", at most 120 of them."""
    return re.sub(r"[^A-Za-z0-9_.=+-]", "_", text)[:120]


def run_name(i: int, overrides: dict) -> str:
    parts = [f"{k.split('.')[-1]}={v}" for k, v in overrides.items()]
    return _safe_name(f"{i:02d}_" + ",".join(parts))


def cli_value(v) -> str:
    return json.dumps(v) if isinstance(v, (list, tuple, dict, bool)) or v is None else str(v)


def config_args(settings: dict, overrides: dict, out_dir: pathlib.Path, root: pathlib.Path) -> list[str]:
    """The script's config arguments: `--config=CONFIG --config.a.b=v ... --config.OUT_FIELD=out_dir`."""
    return ([f"--config={root / settings['CONFIG']}"] + [f"--config.{k}={cli_value(v)}" for k, v in overrides.items()]
            + [f"--config.{settings['OUT_FIELD']}={out_dir}"])


def command(settings: dict, overrides: dict, out_dir: pathlib.Path, root: pathlib.Path) -> list[str]:
    return ([sys.executable, str(root / settings["SCRIPT"])] + config_args(settings, overrides, out_dir, root)
            + [str(a) for a in settings["EXTRA_ARGS"]])


def run_summary(run_dir: pathlib.Path) -> dict:
    """Numbers a run left behind: its summary.json, then the last metrics.jsonl record (prefixed last/)."""
    out = {}
    s = run_dir / "summary.json"
    if s.exists():
        out.update({k: v for k, v in json.loads(s.read_text()).items() if isinstance(v, (int, float, str))})
    m = run_dir / "metrics.jsonl"
    if m.exists():
        recs = read_jsonl(m)
        if recs:
            out.update({f"last/{k}": v for k, v in recs[-1].items() if isinstance(v, (int, float))})
    return out


def plot_curves(rows: list[dict], out_dir: pathlib.Path, x: str, y: str) -> pathlib.Path | None:
    import matplotlib  # noqa: PLC0415 - heavy, plotting only
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - heavy, plotting only
    fig, ax = plt.subplots(figsize=(6.5, 4))
    drawn = 0
    for r in rows:
        m = out_dir / r["run"] / "metrics.jsonl"
        if not m.exists():
            continue
        pts = sorted((q[x], q[y]) for q in read_jsonl(m) if x in q and y in q)
        if pts:
            ax.plot(*zip(*pts), label=r["run"])
            drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel(x), ax.set_ylabel(y), ax.grid(alpha=0.3), ax.legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / "curves.png"
    fig.savefig(path, dpi=100), plt.close(fig)
    return path


def tracking_overrides(cfg, merged: dict, sweep_name: str, run: str) -> dict:
    """``exp.wandb.group`` = the sweep's name and ``exp.wandb.name`` = the member's run name, for a
    config with an ``exp.wandb`` block (horizon.utils.tracking), each unless `merged` sets it already."""
    if cfg.get("exp") is None or "wandb" not in cfg.exp:
        return {}
    want = {"exp.wandb.group": sweep_name, "exp.wandb.name": run}
    return {k: v for k, v in want.items() if k not in merged}


def table_rows(rows: list[dict]) -> list[dict]:
    """`rows` without their nested ``provenance`` field (for the Markdown tables)."""
    return [{k: v for k, v in r.items() if k != "provenance"} for r in rows]


def default_out(root: pathlib.Path, name: str, common: dict) -> pathlib.Path:
    """runs/sweeps/<NAME>, suffixed with the overrides every run gets (``+seed=1``): another seed of a sweep
    never resumes the first one's runs."""
    tail = "".join(f"+{k.split('.')[-1]}={v}" for k, v in common.items())
    return root / "runs" / "sweeps" / _safe_name(name + tail)


def run_sweep(sweep_path: str | pathlib.Path, out: str | pathlib.Path | None = None, *, root: str | pathlib.Path,
              dry_run: bool = False, timeout_s: float | None = None, env: dict | None = None,
              common: dict | None = None) -> list[dict]:
    """Run every override of the sweep file, each with `common` last ({"seed": 1}: every run's); returns the
    summary rows (also written to disk)."""
    root = pathlib.Path(root)
    settings, runs = load_sweep(sweep_path)
    common = dict(common or {})
    out_dir = pathlib.Path(out or default_out(root, settings["NAME"], common)).resolve()
    commit = git_commit(root)
    plan = []
    for i, ov in enumerate(runs):       # every run's arguments parsed before the first run starts
        merged = {**settings["BASE_OVERRIDES"], **ov, **common}
        name = run_name(i, ov)
        cfg = cli.parse(config_args(settings, merged, out_dir / name, root), default="")
        extra = tracking_overrides(cfg, merged, settings["NAME"], name)
        if extra:
            merged = {**merged, **extra}
            cfg = cli.parse(config_args(settings, merged, out_dir / name, root), default="")
        plan.append((i, ov, merged, name, cfg))
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, ov, merged, name, cfg in progress(plan, desc=f"sweep {settings['NAME']}", unit="run"):
        run_dir = out_dir / name
        run_dir.mkdir(parents=True, exist_ok=True)
        dump_config(cfg, run_dir / "config.json")
        cmd = command(settings, merged, run_dir, root)
        info = dict(run=name, overrides=ov, base_overrides=settings["BASE_OVERRIDES"], common_overrides=common,
                    seed=int(cfg.get("seed", -1)), git_commit=commit, script=settings["SCRIPT"],
                    config=settings["CONFIG"], command=cmd)
        prov = Provenance.start(cfg)
        t0 = time.time()
        if dry_run:
            rc = None
        else:
            say(f"[sweep {i + 1}/{len(runs)}] {' '.join(cmd)}")
            with (run_dir / "stdout.log").open("w") as log:
                try:
                    rc = subprocess.run(cmd, cwd=root, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s,
                                        env={**os.environ, **(env or {})}).returncode
                except subprocess.TimeoutExpired:
                    rc = "timeout"
        info.update(returncode=rc, wall_s=time.time() - t0, provenance=prov.fields())
        (run_dir / "sweep_run.json").write_text(json.dumps(info, indent=2, default=str))
        row = dict(run=name)
        row.update(ov)
        row.update(seed=info["seed"], returncode=rc, wall_s=info["wall_s"], git_commit=commit[:12])
        row.update(run_summary(run_dir))
        row["provenance"] = info["provenance"]
        rows.append(row)
        if rc not in (0, None):
            say(f"[sweep] run {name} failed ({rc}); see {run_dir / 'stdout.log'}")
    write_jsonl(out_dir / "summary.jsonl", rows)
    (out_dir / "summary.md").write_text(f"# Sweep {settings['NAME']} ({settings['SCRIPT']} {settings['CONFIG']}, "
                                        f"commit {commit})\n\n" + markdown_table(table_rows(rows)))
    if not dry_run and settings["PLOT"]:
        plot_curves(rows, out_dir, *settings["PLOT"])
    return rows
