"""Run an experiment script once per config override and tabulate the runs (docs/SPEC.md §7 researcher workflow).

    python experiments/sweep.py --sweep=configs/sweeps/lr_tiny.py [--out=runs/sweeps/lr_tiny] [--dry_run]
    python experiments/sweep.py --sweep=configs/sweeps/pretrain_rl.py --config.seed=1   # every run, this override

A sweep file is a Python file with `get_sweep() -> list[dict]`: one dict of dotted config overrides per run
(e.g. {"train.lr": 1e-3, "seed": 1}). Module-level settings (defaults in brackets): SCRIPT
[experiments/pretrain.py], CONFIG [configs/tiny.py], BASE_OVERRIDES [{}] (applied to every run first),
OUT_FIELD ["train.output_dir"]: the config field holding the script's run directory, EXTRA_ARGS [()], PLOT
[("step", "loss")], NAME [file stem]. Every run's command is `SCRIPT --config=CONFIG --config.a.b=v ...
--config.OUT_FIELD=<run dir>` (the one dialect, `horizon.utils.cli`), parsed here first by the same parser, so
a bad override fails before any run starts. `--config.a.b=v` given to this script applies to every run, after
the sweep's own overrides (another seed of a whole sweep), and names the default output dir
(`runs/sweeps/<NAME>+b=v`). Runs are sequential subprocesses (a progress bar over them); each gets
`<out>/<run name>/` with `sweep_run.json` (overrides, seed, git commit, command, exit code, wall time, provenance),
`config.json` (the resolved config as the sweep sees it) and whatever the script writes there. Across runs:
`<out>/summary.jsonl` (one row per run, with its provenance), `<out>/summary.md` (overrides + exit code + the
run's summary.json values + last metrics.jsonl record) and `<out>/curves.png` (PLOT's y vs x for every run).

Each member is its own tracked run: it logs TensorBoard event files in its run dir, so
`tensorboard --logdir <out>` compares the members side by side; with `exp.wandb.project` set (a
BASE_OVERRIDES entry, say) each member is a W&B run named after its run dir and grouped by the
sweep's NAME (`exp.wandb.group` / `exp.wandb.name`, added unless the sweep sets them).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from horizon.eval.report import markdown_table
from horizon.eval.sweep import run_sweep, table_rows
from horizon.utils import cli

REPO = pathlib.Path(__file__).resolve().parents[1]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweep", required=True, help="sweep file with get_sweep() -> list of override dicts")
    p.add_argument("--out", default=None, help="sweep output dir (default runs/sweeps/<NAME>)")
    p.add_argument("--dry_run", action="store_true", help="write run dirs and commands, run nothing")
    p.add_argument("--timeout_s", type=float, default=None, help="per-run timeout")
    a, rest = p.parse_known_args(argv)
    try:
        common = cli.overrides(rest)
        rows = run_sweep(a.sweep, a.out, root=REPO, dry_run=a.dry_run, timeout_s=a.timeout_s, common=common)
    except (cli.ConfigError, FileNotFoundError, TypeError, ValueError, AttributeError) as e:
        cli.fail(str(e), "experiments/sweep.py")
    print("\n" + markdown_table(table_rows(rows)))
    failed = [r["run"] for r in rows if r["returncode"] not in (0, None)]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
