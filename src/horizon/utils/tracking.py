"""One metrics writer behind every driver's `log` (docs/SPEC.md §7.1): JSONL, TensorBoard, W&B.

`MetricsWriter(out_dir, config)` is called with one flat record per event, as every driver did
with its JSONL log: ``log({"phase": "rl", "step": 3, "reward_mean": 0.41, ...})``. Each record
goes to

- ``<out_dir>/metrics.jsonl``, one JSON object per line, with ``time_s`` since the writer opened
  (the file every table, plot and resume reads; unchanged from before);
- TensorBoard event files in ``<out_dir>`` (tensorboardX; no TensorFlow) when ``exp.tensorboard``:
  every finite number of the record as scalar ``<phase>/<key>`` at the record's ``step`` (a record
  without a step counts its phase's records), so ``tensorboard --logdir runs`` shows every run
  side by side; a record with a ``run`` field (one study run among several in one log) goes to
  its own event directory ``<out_dir>/<run>``;
- a Weights & Biases run when ``exp.wandb.project`` is set (``exp.wandb.mode``: "offline" by
  default, synced later with ``wandb sync <out_dir>/wandb/offline-run-*``), each phase on its own
  x axis ``<phase>/step``.

Beyond scalars: `histograms` (rewards, advantages, staleness), `table` (eval tables), `text`
(a rollout transcript every ``exp.text_every`` RL steps) and, at `close`, the resolved config as
TensorBoard hparams with the run's final numbers, so a sweep's members compare in one view.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import re
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections
import numpy as np

from horizon.utils.config import ConfigError

TEXT_EVERY = 10


def tracking_fields() -> dict:
    """The tracking settings every driver config's ``exp`` block holds (module docstring)."""
    return dict(
        tensorboard=True,                 # event files in the run dir: tensorboard --logdir runs
        text_every=TEXT_EVERY,            # one rollout transcript as text every N RL steps (0 = never)
        wandb=ml_collections.ConfigDict(dict(
            project="",                   # set to log to Weights & Biases ("" = off)
            mode="offline",               # "offline": <run dir>/wandb/offline-run-*, `wandb sync` later; "online"
            entity="", group="",          # group: e.g. the sweep's name (experiments/sweep.py sets it)
            name="",                      # "" = the run dir's name
        )),
    )


@dataclasses.dataclass(frozen=True)
class TrackingConfig:
    """What `MetricsWriter` writes besides JSONL, from a config's ``exp`` block (`from_config`)."""

    tensorboard: bool = True
    text_every: int = TEXT_EVERY
    wandb_project: str = ""
    wandb_mode: str = "offline"
    wandb_entity: str = ""
    wandb_group: str = ""
    wandb_name: str = ""

    @classmethod
    def from_config(cls, c: ml_collections.ConfigDict | None) -> TrackingConfig:
        """`c.exp`'s tracking fields; the defaults where `c` has no ``exp`` block or a field is absent."""
        e = c.get("exp") if c is not None else None
        if e is None:
            return cls()
        w = e.get("wandb") or {}
        return cls(tensorboard=bool(e.get("tensorboard", True)), text_every=int(e.get("text_every", TEXT_EVERY)),
                   wandb_project=str(w.get("project", "") or ""), wandb_mode=str(w.get("mode", "offline")),
                   wandb_entity=str(w.get("entity", "") or ""), wandb_group=str(w.get("group", "") or ""),
                   wandb_name=str(w.get("name", "") or ""))

    def validate(self) -> None:
        """`ConfigError` (one line, before any work: `horizon.utils.cli.load` calls it) on a bad field."""
        if self.wandb_mode not in ("offline", "online", "disabled"):
            raise ConfigError(f"exp.wandb.mode={self.wandb_mode!r}: must be 'offline', 'online' or 'disabled'")
        if self.text_every < 0:
            raise ConfigError(f"exp.text_every={self.text_every}: must be >= 0")


def scalars(rec: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numbers of `rec` (bools as 0/1, nested dicts flattened with "/"), keyed as logged."""
    out = {}
    for k, v in rec.items():
        if isinstance(v, Mapping):
            out.update(scalars(v, f"{prefix}{k}/"))
        elif isinstance(v, (bool, int, float, np.number)) and math.isfinite(float(v)):
            out[f"{prefix}{k}"] = float(v)
    return out


def flat_config(c: ml_collections.ConfigDict | Mapping | None) -> dict[str, Any]:
    """`c` as {dotted.name: value}, values as bool/int/float/str (TensorBoard hparams, W&B filters)."""
    d = json.loads(c.to_json_best_effort()) if isinstance(c, ml_collections.ConfigDict) else dict(c or {})
    out: dict[str, Any] = {}

    def walk(x, pre):
        for k, v in x.items():
            if isinstance(v, Mapping):
                walk(v, f"{pre}{k}.")
            else:
                out[f"{pre}{k}"] = v if isinstance(v, (bool, int, float, str)) else json.dumps(v)
    walk(d, "")
    return out


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", name).strip("_") or "run"


class MetricsWriter:
    """A run's metrics log (module docstring). Callable like the JSONL log it replaces; keeps the
    records it wrote (`records`); `close` it once (or use it as a context manager)."""

    def __init__(self, out_dir: str | pathlib.Path, config: ml_collections.ConfigDict | None = None, *,
                 jsonl: str = "metrics.jsonl", tracking: TrackingConfig | None = None, purge_step: int | None = None):
        self.out_dir = pathlib.Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.tracking = tracking if tracking is not None else TrackingConfig.from_config(config)
        self.tracking.validate()
        self.t0 = time.time()
        self.records: list[dict] = []
        self.f = open(self.out_dir / jsonl, "a")
        self._purge = purge_step
        self._tb: dict[str, Any] = {}
        self._counts: dict[tuple, int] = {}
        self._axes: set[str] = set()
        self._wandb = self._start_wandb() if self.tracking.wandb_project else None
        if self.tracking.tensorboard and config is not None:
            self.text("config", json.dumps(json.loads(config.to_json_best_effort()), indent=1, sort_keys=True), 0)

    # --- the record log
    def __call__(self, rec: dict) -> None:
        rec = dict(rec, time_s=time.time() - self.t0)
        self.records.append(rec)
        self.f.write(json.dumps(rec) + "\n")
        self.f.flush()
        phase = str(rec.get("phase", "") or "")
        step = self._step(rec, phase)
        vals = {k: v for k, v in scalars(rec).items() if k not in ("step", "time_s")}
        if not vals:
            return
        tb = self._writer(rec.get("run"))
        if tb is not None:
            for k, v in vals.items():
                tb.add_scalar(f"{phase}/{k}" if phase else k, v, step)
            tb.flush()
        if self._wandb is not None:
            run = f"{_safe(rec['run'])}/" if rec.get("run") else ""
            axis = f"{run}{phase or 'metrics'}"
            self._define_axis(axis)
            self._wandb.log({f"{axis}/step": step, **{f"{axis}/{k}": v for k, v in vals.items()}})

    def _step(self, rec: dict, phase: str) -> int:
        key = (rec.get("run"), phase)
        self._counts[key] = self._counts.get(key, 0) + 1
        return int(rec["step"]) if isinstance(rec.get("step"), (int, float, np.integer)) else self._counts[key] - 1

    # --- beyond scalars
    def histograms(self, step: int, values: Mapping[str, Sequence[float] | np.ndarray], *, phase: str = "rl",
                   run: str | None = None) -> None:
        """Histograms of `values` ({name: numbers}) at `step` as ``<phase>/<name>``; empty ones skipped."""
        vals = {k: np.asarray(v, np.float64).ravel() for k, v in values.items()}
        vals = {k: v[np.isfinite(v)] for k, v in vals.items()}
        vals = {k: v for k, v in vals.items() if v.size}
        tb = self._writer(run)
        for k, v in vals.items() if tb is not None else ():
            tb.add_histogram(f"{phase}/{k}", v, step)
        if self._wandb is not None and vals:
            import wandb  # noqa: PLC0415 - optional backend, imported only when a W&B run is open

            axis = f"{_safe(run) + '/' if run else ''}{phase}"
            self._define_axis(axis)
            self._wandb.log({f"{axis}/step": step, **{f"{axis}/{k}": wandb.Histogram(v) for k, v in vals.items()}})

    def table(self, name: str, rows: Sequence[Mapping[str, Any]], step: int, *, run: str | None = None) -> None:
        """An eval table (`rows`: dicts with the same keys) as markdown text in TensorBoard and a
        `wandb.Table` in W&B."""
        if not rows:
            return
        cols = list(rows[0])
        md = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n" + "".join(
            "| " + " | ".join(str(_cell(r.get(c))) for c in cols) + " |\n" for r in rows)
        self.text(name, md, step, run=run, markdown=True, to_wandb=False)
        if self._wandb is not None:
            import wandb  # noqa: PLC0415 - optional backend, imported only when a W&B run is open

            self._wandb.log({name: wandb.Table(columns=cols, data=[[_cell(r.get(c)) for c in cols] for r in rows])})

    def text(self, name: str, text: str, step: int, *, run: str | None = None, markdown: bool = False,
             to_wandb: bool = True) -> None:
        """A text sample in TensorBoard's Text tab (verbatim, as a code block, so a transcript's
        `<function=...>` tags survive; `markdown=True` renders it) and, in W&B, an HTML panel."""
        tb = self._writer(run)
        if tb is not None:
            tb.add_text(name, text if markdown else "```\n" + text.replace("```", "'''") + "\n```", step)
            tb.flush()
        if self._wandb is not None and to_wandb:
            import html  # noqa: PLC0415

            import wandb  # noqa: PLC0415 - optional backend, imported only when a W&B run is open

            self._wandb.log({name: wandb.Html(f"<pre>{html.escape(text)}</pre>")})

    def wants_text(self, step: int) -> bool:
        """Whether RL step `step` logs a transcript (every ``exp.text_every`` steps, and the first)."""
        n = self.tracking.text_every
        return n > 0 and (step == 1 or step % n == 0)

    def close(self, final: Mapping[str, Any] | None = None) -> None:
        """Flush and close every backend; `final` (e.g. summary.json's numbers) is written as the
        hparams session's metrics next to the resolved config."""
        if self.f.closed:
            return
        self.f.close()
        metrics = {f"final/{k}": v for k, v in scalars(final or {}).items()}
        if self.config is not None and self.tracking.tensorboard:
            tb = self._writer(None)
            _write_hparams(tb, flat_config(self.config), metrics)
        for w in self._tb.values():
            w.close()
        if self._wandb is not None:
            if metrics:
                self._wandb.summary.update(metrics)
            self._wandb.finish()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- backends
    def _writer(self, run: str | None):
        if not self.tracking.tensorboard:
            return None
        key = run or ""
        if key not in self._tb:
            d = self.out_dir / _safe(run) if run else self.out_dir
            self._tb[key] = _summary_writer()(str(d), purge_step=self._purge, flush_secs=10)
        return self._tb[key]

    def _start_wandb(self):
        import wandb  # noqa: PLC0415 - optional backend: imported only when exp.wandb.project is set

        t = self.tracking
        return wandb.init(project=t.wandb_project, entity=t.wandb_entity or None, group=t.wandb_group or None,
                          name=t.wandb_name or self.out_dir.name, mode=t.wandb_mode, dir=str(self.out_dir),
                          config=json.loads(self.config.to_json_best_effort()) if self.config is not None else None,
                          settings=wandb.Settings(console="off", silent=True), reinit="finish_previous")

    def _define_axis(self, axis: str) -> None:
        if axis not in self._axes:
            self._axes.add(axis)
            self._wandb.define_metric(f"{axis}/step")
            self._wandb.define_metric(f"{axis}/*", step_metric=f"{axis}/step")


def _summary_writer():
    """tensorboardX's `SummaryWriter`, imported without torch where torch is not loaded yet:
    tensorboardX imports torch at module top when it is installed (~2 s in every process that
    writes events, e.g. each spawned RL trainer) only to recognise torch tensors, which this
    writer never passes. A `None` entry in `sys.modules` makes that import fail into its fallback."""
    if "torch" in sys.modules or "tensorboardX" in sys.modules:
        from tensorboardX import SummaryWriter  # noqa: PLC0415 - heavy; only a process that writes events

        return SummaryWriter
    sys.modules["torch"] = None
    try:
        from tensorboardX import SummaryWriter  # noqa: PLC0415 - heavy; only a process that writes events
    finally:
        del sys.modules["torch"]
    return SummaryWriter


def _cell(v) -> Any:
    if isinstance(v, float):
        return round(v, 4)
    return v if isinstance(v, (int, str, bool)) or v is None else json.dumps(v)


def _write_hparams(tb, hparams: dict, metrics: dict) -> None:
    """The hparams plugin's three summaries in `tb`'s own event file (tensorboardX's `add_hparams`
    would open a second run directory), and each metric as a scalar the plugin reads."""
    from tensorboardX.summary import hparams as hparams_summary  # noqa: PLC0415 - heavy; loaded by `_summary_writer`

    exp, ssi, sei = hparams_summary(hparams, metrics)
    fw = tb._get_file_writer()
    for s in (exp, ssi, sei):
        fw.add_summary(s)
    for k, v in metrics.items():
        tb.add_scalar(k, v, 0)


def read_scalars(logdir: str | pathlib.Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars of the TensorBoard event files directly in `logdir`, {tag: [(step, value)]} in
    write order (tensorboard's own event reader): to plot or check a run without the UI."""
    from tensorboard.backend.event_processing.event_accumulator import (  # noqa: PLC0415 - readers only
        SCALARS,
        EventAccumulator,
    )

    acc = EventAccumulator(str(logdir), size_guidance={SCALARS: 0})
    acc.Reload()
    return {t: [(int(e.step), float(e.value)) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
