"""Rebuild docs/RESULTS.md, the project's findings, from the committed study ledgers (docs/SPEC.md §7).

    python experiments/results.py            # write docs/RESULTS.md
    python experiments/results.py --check    # write nothing; exit 1 if docs/RESULTS.md is stale

Every docs/results/*.jsonl is one study's ledger (study = the file's stem; rows appended by the
study's driver, `horizon.studies.ledger`), with optional free-text notes docs/results/<study>.md
appended under its tables. The text is `horizon.studies.results_md.render` of them; paths are
relative to the repository root, so the script runs from any directory.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from horizon.studies.ledger import RESULTS_DIR, read_rows  # noqa: E402
from horizon.studies.results_md import render  # noqa: E402

OUT = "docs/RESULTS.md"


def build(root: pathlib.Path) -> str:
    """The text docs/RESULTS.md should hold, from the ledgers and notes under `root`."""
    ledgers = sorted((root / RESULTS_DIR).glob("*.jsonl"))
    rows = {p.stem: read_rows(p) for p in ledgers}
    notes = {p.stem: p.with_suffix(".md").read_text() for p in ledgers if p.with_suffix(".md").exists()}
    return render(rows, notes_by_study=notes)


def main(argv=None, *, root: str | pathlib.Path = ROOT) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], prog="experiments/results.py")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if the file differs")
    a = p.parse_args(argv)
    root = pathlib.Path(root)
    text, out = build(root), root / OUT
    if a.check:
        if not out.exists() or out.read_text() != text:
            print(f"{OUT} is stale: run python experiments/results.py and commit it", file=sys.stderr)
            return 1
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out} from {len(list((root / RESULTS_DIR).glob('*.jsonl')))} ledger(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
