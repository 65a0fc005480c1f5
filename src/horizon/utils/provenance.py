"""Provenance: what produced a number (docs/SPEC.md §7.2).

Every `summary.json`, every row a study appends and every benchmark's printed record carries the
same fields, so a figure in docs/PERF.md or in a study table can be traced back to its run:

- ``git_commit`` and ``git_dirty`` (tracked files changed since that commit) of the checkout the
  code was imported from;
- ``config_hash``: the first 16 hex digits of sha256 of the resolved config as sorted JSON (two
  runs with equal hashes ran the same hyperparameters);
- ``seeds``; ``started_at`` (UTC, ISO 8601); ``wall_s``; ``loadavg_start``: the machine's 1, 5 and
  15-minute load averages when the run began (a timing taken at load 14 on 2 cores is not one
  taken at load 0); ``host``, ``cpu`` (model, widest SIMD and core count: XLA:CPU compiles for the
  machine's instruction set, so the same commit may produce different floats on two
  machines), ``python``, ``jax``.

`Provenance.start(config, seeds)` records the start; `.fields()` adds the wall time so far.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import hashlib
import json
import os
import pathlib
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from typing import Any

import ml_collections

REPO = pathlib.Path(__file__).resolve().parents[3]
FIELDS = ("git_commit", "git_dirty", "config_hash", "seeds", "started_at", "wall_s", "loadavg_start", "host",
          "cpu", "python", "jax")


def git_state(cwd: str | pathlib.Path = REPO) -> tuple[str, bool | None]:
    """(`git rev-parse HEAD`, whether tracked files differ from it) of `cwd`'s checkout;
    ("unknown", None) outside a git checkout or without git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if head.returncode != 0 or not head.stdout.strip():
            return "unknown", None
        st = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd, capture_output=True,
                            text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown", None
    return head.stdout.strip(), (bool(st.stdout.strip()) if st.returncode == 0 else None)


def config_hash(config: ml_collections.ConfigDict | dict | None) -> str | None:
    """sha256 (16 hex digits) of `config` as JSON with sorted keys; None for no config."""
    if config is None:
        return None
    d = json.loads(config.to_json_best_effort()) if isinstance(config, ml_collections.ConfigDict) else config
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_average() -> list[float] | None:
    """The 1, 5 and 15-minute load averages (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def cpu() -> str:
    """"<model> (<widest SIMD extension>, <n> cores)" from /proc/cpuinfo (`platform.processor()`
    where there is none)."""
    try:
        lines = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"
    field = lambda name: next((x.split(":", 1)[1].strip() for x in lines if x.startswith(name)), "")  # noqa: E731
    flags = set(field("flags").split())
    simd = next((f for f in ("avx512f", "avx2", "avx", "sse4_2", "asimd") if f in flags), "no SIMD flag")
    return f"{field('model name') or platform.machine()} ({simd}, {os.cpu_count()} cores)"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@dataclasses.dataclass(frozen=True)
class Provenance:
    """A run's provenance, taken when it starts (`start`); `fields()` is what results carry."""

    git_commit: str
    git_dirty: bool | None
    config_hash: str | None
    seeds: tuple[int, ...]
    started_at: str
    loadavg_start: list[float] | None
    host: str
    cpu: str
    t0: float = dataclasses.field(repr=False, default=0.0)

    @classmethod
    def start(cls, config: ml_collections.ConfigDict | dict | None = None,
              seeds: Sequence[int] | int | None = None) -> Provenance:
        """The provenance of a run starting now with `config` and `seeds` (default: `config.seed`)."""
        if seeds is None and config is not None:
            seeds = config.get("seed")
        seeds = () if seeds is None else (int(seeds),) if isinstance(seeds, int) else tuple(int(s) for s in seeds)
        commit, dirty = git_state()
        now = time.time()
        return cls(git_commit=commit, git_dirty=dirty, config_hash=config_hash(config), seeds=seeds,
                   started_at=datetime.datetime.fromtimestamp(now, datetime.UTC).isoformat(timespec="seconds"),
                   loadavg_start=load_average(), host=socket.gethostname(), cpu=cpu(), t0=now)

    def fields(self) -> dict[str, Any]:
        """The provenance fields (module docstring), with the wall time since `start`."""
        return dict(git_commit=self.git_commit, git_dirty=self.git_dirty, config_hash=self.config_hash,
                    seeds=list(self.seeds), started_at=self.started_at, wall_s=round(time.time() - self.t0, 3),
                    loadavg_start=self.loadavg_start, host=self.host, cpu=self.cpu, python=platform.python_version(),
                    jax=_version("jax"))

    def stamp(self, record: dict) -> dict:
        """`record` with a ``provenance`` field (a copy)."""
        return dict(record, provenance=self.fields())


def announce(argv: Sequence[str] | None = None, *, config=None, seeds=None, file=None) -> Provenance:
    """A benchmark's provenance: started now and printed as one ``provenance: {json}`` line with the
    command line, and again with the final wall time when the process exits, so every record it
    prints sits between two lines naming its commit, arguments, load and duration."""
    argv = list(sys.argv if argv is None else argv)
    p = Provenance.start(config if config is not None else {"argv": argv}, seeds)
    out = file or sys.stdout

    def emit():
        try:
            print("provenance: " + json.dumps(dict(p.fields(), argv=argv)), file=out, flush=True)
        except (ValueError, OSError):      # the stream closed first (a benchmark run inside pytest)
            pass

    emit()
    atexit.register(emit)
    return p
