"""Run an experiment script once per config override and tabulate the runs (SPEC §7 researcher workflow).

    python experiments/sweep.py --sweep=configs/sweeps/lr_tiny.py [--out=runs/sweeps/lr_tiny] [--dry_run]

A sweep file is a Python file with `get_sweep() -> list[dict]`: one dict of dotted config
overrides per run (e.g. {"train.lr": 1e-3, "seed": 1}). Module-level settings (defaults in
brackets): SCRIPT [experiments/pretrain.py], CONFIG [configs/tiny.py], BASE_OVERRIDES [{}] (applied
to every run first), OVERRIDE_STYLE ["absl": `--config.a.b=v`, or "set": `--set a.b=v`],
CONFIG_FLAG ["--config"], OUT_FLAG ["--workdir"], EXTRA_ARGS [()], PLOT [("step", "loss")],
NAME [file stem]. Runs are sequential subprocesses; each gets `<out>/<run name>/` with
`sweep_run.json` (overrides, seed, git commit, command, exit code, wall time), `config.json`
(the resolved config as the sweep sees it) and whatever the script writes there. Across runs:
`<out>/summary.jsonl`, `<out>/summary.md` (overrides + exit code + the run's summary.json values
+ last metrics.jsonl record) and `<out>/curves.png` (PLOT's y vs x for every run).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
from horizon.eval.report import markdown_table, read_jsonl, write_jsonl  # noqa: E402
from horizon.utils.config import dump_config, load_config_file  # noqa: E402

DEFAULTS = dict(SCRIPT="experiments/pretrain.py", CONFIG="configs/tiny.py", BASE_OVERRIDES={}, OVERRIDE_STYLE="absl",
                CONFIG_FLAG="--config", OUT_FLAG="--workdir", EXTRA_ARGS=(), PLOT=("step", "loss"), NAME=None)


def git_commit(cwd: str | pathlib.Path = REPO) -> str:
    """`git rev-parse HEAD`, or "unknown" outside a git repo / without git."""
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else "unknown"


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
    settings = {k: getattr(mod, k, v) for k, v in DEFAULTS.items()}
    settings["NAME"] = settings["NAME"] or path.stem
    if settings["OVERRIDE_STYLE"] not in ("absl", "set"):
        raise ValueError(f"OVERRIDE_STYLE must be 'absl' or 'set', got {settings['OVERRIDE_STYLE']!r}")
    return settings, [dict(r) for r in runs]


def run_name(i: int, overrides: dict) -> str:
    parts = [f"{k.split('.')[-1]}={v}" for k, v in overrides.items()]
    return re.sub(r"[^A-Za-z0-9_.=+-]", "_", f"{i:02d}_" + ",".join(parts))[:120]


def apply_overrides(cfg, overrides: dict):
    for path, value in overrides.items():
        *parents, leaf = path.split(".")
        node = cfg
        for name in parents:
            if name not in node:
                raise KeyError(f"override {path!r}: no config section {name!r}")
            node = node[name]
        if leaf not in node:
            raise KeyError(f"override {path!r}: unknown config field")
        node[leaf] = value
    return cfg


def cli_value(v) -> str:
    return json.dumps(v) if isinstance(v, (list, tuple, dict, bool)) or v is None else str(v)


def command(settings: dict, overrides: dict, out_dir: pathlib.Path) -> list[str]:
    cmd = [sys.executable, str(REPO / settings["SCRIPT"]), f"{settings['CONFIG_FLAG']}={REPO / settings['CONFIG']}"]
    for k, v in overrides.items():
        if settings["OVERRIDE_STYLE"] == "absl":
            cmd.append(f"{settings['CONFIG_FLAG']}.{k}={cli_value(v)}")
        else:
            cmd += ["--set", f"{k}={cli_value(v)}"]
    return cmd + [f"{settings['OUT_FLAG']}={out_dir}"] + [str(a) for a in settings["EXTRA_ARGS"]]


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
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
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


def run_sweep(sweep_path: str | pathlib.Path, out: str | pathlib.Path | None = None, *, dry_run: bool = False,
              timeout_s: float | None = None, env: dict | None = None) -> list[dict]:
    """Run every override of the sweep file; returns the summary rows (also written to disk)."""
    settings, runs = load_sweep(sweep_path)
    out_dir = pathlib.Path(out or REPO / "runs" / "sweeps" / settings["NAME"]).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    commit = git_commit()
    rows = []
    for i, ov in enumerate(runs):
        merged = {**settings["BASE_OVERRIDES"], **ov}
        name = run_name(i, ov)
        run_dir = out_dir / name
        run_dir.mkdir(parents=True, exist_ok=True)
        cfg = apply_overrides(load_config_file(REPO / settings["CONFIG"]), merged)   # fails fast on bad keys
        dump_config(cfg, run_dir / "config.json")
        cmd = command(settings, merged, run_dir)
        info = dict(run=name, overrides=ov, base_overrides=settings["BASE_OVERRIDES"],
                    seed=int(cfg.get("seed", -1)), git_commit=commit, script=settings["SCRIPT"],
                    config=settings["CONFIG"], command=cmd)
        t0 = time.time()
        if dry_run:
            rc = None
        else:
            print(f"[sweep {i + 1}/{len(runs)}] {' '.join(cmd)}", flush=True)
            with (run_dir / "stdout.log").open("w") as log:
                try:
                    rc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s,
                                        env={**os.environ, **(env or {})}).returncode
                except subprocess.TimeoutExpired:
                    rc = "timeout"
        info.update(returncode=rc, wall_s=time.time() - t0)
        (run_dir / "sweep_run.json").write_text(json.dumps(info, indent=2, default=str))
        row = dict(run=name)
        row.update(ov)
        row.update(seed=info["seed"], returncode=rc, wall_s=info["wall_s"], git_commit=commit[:12])
        row.update(run_summary(run_dir))
        rows.append(row)
        if rc not in (0, None):
            print(f"[sweep] run {name} failed ({rc}); see {run_dir / 'stdout.log'}", flush=True)
    write_jsonl(out_dir / "summary.jsonl", rows)
    (out_dir / "summary.md").write_text(f"# Sweep {settings['NAME']} ({settings['SCRIPT']} {settings['CONFIG']}, "
                                        f"commit {commit})\n\n" + markdown_table(rows))
    if not dry_run and settings["PLOT"]:
        plot_curves(rows, out_dir, *settings["PLOT"])
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweep", required=True, help="sweep file with get_sweep() -> list of override dicts")
    p.add_argument("--out", default=None, help="sweep output dir (default runs/sweeps/<NAME>)")
    p.add_argument("--dry_run", action="store_true", help="write run dirs and commands, run nothing")
    p.add_argument("--timeout_s", type=float, default=None, help="per-run timeout")
    a = p.parse_args(argv)
    rows = run_sweep(a.sweep, a.out, dry_run=a.dry_run, timeout_s=a.timeout_s)
    print("\n" + markdown_table(rows))
    failed = [r["run"] for r in rows if r["returncode"] not in (0, None)]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
