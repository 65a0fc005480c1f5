"""Re-plot any metrics JSONL to a PNG: choose the x key and y keys (docs/SPEC.md §7).

    python experiments/plot.py runs/pretrain_tiny/metrics.jsonl --x=step --y=loss --y=eval_loss
    python experiments/plot.py runs/eval_tiny/records.jsonl --x=pass_index --y=completion_tokens --group=policy
    python experiments/plot.py runs/x/metrics.jsonl --list     # print the keys present

Without --y every numeric key except x is plotted. Default output: <jsonl stem>_<y...>.png next to the file.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))
from horizon.eval.report import plot_jsonl, read_jsonl  # noqa: E402


def main(argv=None) -> pathlib.Path | None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("jsonl")
    p.add_argument("--x", default="step")
    p.add_argument("--y", action="append", default=None, help="y key (repeatable; default all numeric keys)")
    p.add_argument("--group", default=None, help="one curve per value of this key (e.g. policy, run)")
    p.add_argument("--logy", action="store_true")
    p.add_argument("--out", default=None)
    p.add_argument("--list", action="store_true", help="print the keys in the file and exit")
    a = p.parse_args(argv)
    if a.list:
        recs = read_jsonl(a.jsonl)
        keys = sorted({k for r in recs for k in r})
        print(f"{len(recs)} records; keys: {', '.join(keys)}")
        return None
    src = pathlib.Path(a.jsonl)
    out = (pathlib.Path(a.out) if a.out
           else src.with_name(f"{src.stem}_{'_'.join(a.y or ['all'])}.png".replace("/", "-")))
    path = plot_jsonl(src, out, x=a.x, y=a.y, group=a.group, logy=a.logy)
    print(path)
    return path


if __name__ == "__main__":
    main()
