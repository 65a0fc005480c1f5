"""Table cells of docs/RESULTS.md (`horizon.studies.results_md`, `horizon.studies.swe_results`):
numbers, signed differences, confidence intervals, seed lists."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def num(v) -> str:
    """A cell: ints as is, floats to 3 decimals, "n/a" for None."""
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def signed(v) -> str:
    """A difference: 3 decimals with its sign, "n/a" for None."""
    return "n/a" if v is None else f"{v:+.3f}"


def ci(lo, hi, f: Callable = num) -> str:
    """"[lo, hi]", or "n/a" when the CI is undefined."""
    return "n/a" if lo is None or hi is None else f"[{f(lo)}, {f(hi)}]"


def seeds_cell(seeds: Sequence[int]) -> str:
    return ", ".join(str(s) for s in seeds) or "n/a"
