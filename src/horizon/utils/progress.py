"""Progress of every phase longer than a few seconds (docs/SPEC.md §7.1).

`progress(iterable, total=..., desc=...)` is a tqdm bar with rate and ETA when standard error is
a terminal, and plain lines without bar characters or carriage returns otherwise (CI logs, files,
pipes): ``<desc>: 12/40 steps (30%), 00:41 elapsed, ETA 01:35, loss=0.412`` every
`every_s` seconds and once when the phase ends. ``HORIZON_PROGRESS=bar|plain|off`` overrides the
choice. `say(line)` prints a line above any open bar (a driver's per-step line), so a bar and the
run's own log never overwrite each other.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

from tqdm import tqdm

MODES = ("bar", "plain", "off")
EVERY_S = 30.0


def mode(file=None) -> str:
    """"bar" on a terminal, else "plain"; ``HORIZON_PROGRESS`` overrides it."""
    m = os.environ.get("HORIZON_PROGRESS", "").strip().lower()
    if m:
        if m not in MODES:
            raise ValueError(f"HORIZON_PROGRESS={m!r}: must be one of {MODES}")
        return m
    f = file if file is not None else sys.stderr
    return "bar" if getattr(f, "isatty", lambda: False)() else "plain"


def clock(seconds: float) -> str:
    """mm:ss, or h:mm:ss from an hour."""
    s = int(max(seconds, 0))
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m:02d}:{s % 60:02d}"


class PlainProgress:
    """tqdm's interface (iterate, `update`, `set_postfix`, `close`, context manager) as plain lines."""

    def __init__(self, iterable: Iterable | None = None, *, total: int | None = None, desc: str = "",
                 unit: str = "it", initial: int = 0, every_s: float = EVERY_S, file=None, quiet: bool = False):
        self.iterable, self.desc, self.unit, self.every_s = iterable, desc, unit, every_s
        self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
        self.n = self.start_n = initial
        self.file, self.quiet = file, quiet
        self.t0 = self.last = time.time()
        self.postfix = ""
        self.closed = False

    def __iter__(self) -> Iterator:
        try:
            for x in self.iterable:
                yield x
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.time()
        if now - self.last >= self.every_s:
            self.last = now
            self._emit(now)

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kw: Any) -> None:
        items = {**(ordered_dict or {}), **kw}
        self.postfix = ", ".join(f"{k}={_fmt(v)}" for k, v in items.items())

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._emit(time.time(), done=True)

    def line(self, now: float, *, done: bool = False) -> str:
        el = now - self.t0
        done_n = self.n - self.start_n
        of = f"/{self.total}" if self.total else ""
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        if done:
            tail = f", done in {clock(el)}"
        else:
            eta = (self.total - self.n) * el / done_n if self.total and done_n > 0 else None
            tail = f", {clock(el)} elapsed" + (f", ETA {clock(eta)}" if eta is not None else "")
        return f"{self.desc}: {self.n}{of} {self.unit}{pct}{tail}" + (f", {self.postfix}" if self.postfix else "")

    def _emit(self, now: float, *, done: bool = False) -> None:
        if not self.quiet:
            print(self.line(now, done=done), file=self.file if self.file is not None else sys.stderr, flush=True)


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "", unit: str = "it",
             initial: int = 0, leave: bool = True, every_s: float = EVERY_S):
    """A progress bar over `iterable` (or updated by hand, `total` steps) for a phase named `desc`:
    tqdm on a terminal, `PlainProgress` lines otherwise, nothing with ``HORIZON_PROGRESS=off``.
    `leave=False` for a phase nested in another (an eval inside the RL loop): its bar disappears
    when it ends."""
    m = mode()
    if m == "bar":
        return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, leave=leave, file=sys.stderr,
                    **_width(sys.stderr))
    return PlainProgress(iterable, total=total, desc=desc, unit=unit, initial=initial, every_s=every_s,
                         quiet=m == "off")


def _width(f) -> dict:
    """Follow the terminal's width, or 100 columns where it reports none (a pty nobody sized: tqdm
    would hide every bar below its zero rows)."""
    try:
        if os.get_terminal_size(f.fileno()).columns > 0:
            return dict(dynamic_ncols=True)
    except (OSError, ValueError, AttributeError):
        pass
    return dict(ncols=100, nrows=24)


def say(line: str) -> None:
    """Print `line` to stdout above any open tqdm bar (plain print where none is open)."""
    if getattr(tqdm, "_instances", None):    # tqdm's own registry of open bars
        tqdm.write(line, file=sys.stdout)
        sys.stdout.flush()
    else:
        print(line, flush=True)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
