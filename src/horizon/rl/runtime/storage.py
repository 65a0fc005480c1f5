"""Group- and rollout-level checkpoint stores for asynchronous RL (docs/SPEC.md §4 "Fault tolerance").

Three checkpoint levels make a restart cheap:

* **step level** — trainer weights + optimizer state (orbax, `horizon.train.checkpoint`),
  written by the trainer (`horizon.rl.runtime.loop.run_rl`, or
  `horizon.rl.runtime.processes.trainer_main`) to the run directory (orbax has its own path handling;
  not `async_.storage_url`);
* **group level** — `GroupStore`: every scored group (trajectories, rewards, Dr.GRPO
  advantages, per-token policy-version tags) is written to storage *as soon as it is produced*,
  one atomic file per slot, under a path or fsspec URL (`async_.storage_url`: a shared filesystem,
  s3://, gs://). A restarted trainer reads ready groups instead of asking for them again; a
  restarted scheduler re-requests only slots that have no group file. (Storage, not Ray's object
  store: a group must outlive the process that wrote it, a Ray object dies with its owner; at a
  group's size both take ~2 ms, benchmarks/transfer.py, docs/PERF.md "Async data paths");
* **rollout level** — `RolloutCheckpoints`: an in-progress episode's state (messages, stats,
  tool state) plus a sandbox filesystem snapshot (`Sandbox.snapshot()`; a Docker image for
  `DockerSandbox`, created with `keep_snapshots=True` so it outlives the process). Optional:
  `restore_episode` rebuilds an `Episode` in a sandbox started from the snapshot, so a rollout
  can continue after a worker restart instead of starting over. (The async loop's default
  does not use it: our toy rollouts are single-turn; see `orchestrator`'s docstring.)

Also `SchedulerState`: the prompt schedule (slot -> prompt id, seed, and the prompt sampler's
`state_dict`), rewritten atomically whenever a step's slots are assigned, so a restarted scheduler
keeps the single-epoch guarantee and re-issues the same prompt for an unfinished slot.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import pickle
import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from horizon.agent.rollout import Episode
from horizon.utils.files import UrlDir, atomic_write_bytes, url_dir

_GROUP_RE = re.compile(r"group_(\d{8})\.pkl")


@dataclasses.dataclass
class GroupRecord:
    """One scored prompt group, the unit the trainer consumes (docs/SPEC.md §4).

    `trajectories` are `horizon.agent.Trajectory`s (per-token `policy_versions` in their
    segments); `advantages` are the Dr.GRPO chain advantages (reward - group mean), stored for
    inspection (the trainer recomputes them identically in `build_batch`).
    """

    slot: int
    prompt_id: str
    trajectories: list
    rewards: list[float]
    advantages: list[float]
    min_version: int                # oldest weights version among the group's tokens
    max_version: int
    start_version: int              # weights version the rollout started with
    generated_tokens: int
    worker: str
    seconds: float                  # rollout wall time
    infos: list[dict] = dataclasses.field(default_factory=list)
    infra: dict = dataclasses.field(default_factory=dict)   # infrastructure counters (core.INFRA_KEYS)
    created: float = dataclasses.field(default_factory=time.time)


class GroupStore:
    """Directory (a path or fsspec URL, `UrlDir`) of `group_<slot>.pkl` files, written once each
    (atomic, no overwrite)."""

    def __init__(self, root: str | pathlib.Path | UrlDir):
        self.root = url_dir(root)

    @staticmethod
    def name(slot: int) -> str:
        return f"group_{int(slot):08d}.pkl"

    def has(self, slot: int) -> bool:
        return self.root.exists(self.name(slot))

    def put(self, record: GroupRecord) -> bool:
        """Write `record`; returns False (and writes nothing) if the slot already has a group (on a
        local filesystem also under concurrent writers, `UrlDir.create`)."""
        return self.root.create(self.name(record.slot), pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL))

    def get(self, slot: int) -> GroupRecord:
        return pickle.loads(self.root.read(self.name(slot)))

    def ready_slots(self) -> list[int]:
        return sorted(int(m.group(1)) for n in self.root.names() if (m := _GROUP_RE.fullmatch(n)))


class SchedulerState:
    """The persistent prompt schedule (`runtime.PromptSchedule.state_dict`: slot table + prompt
    sampler) in `scheduler.json`, rewritten atomically."""

    def __init__(self, path: str | pathlib.Path):
        self.path = pathlib.Path(path)
        self.schedule: dict | None = None

    @classmethod
    def load(cls, path: str | pathlib.Path) -> SchedulerState | None:
        p = pathlib.Path(path)
        if not p.exists():
            return None
        d = json.loads(p.read_text())
        s = cls(p)
        s.schedule = d["schedule"]
        return s

    def save(self) -> None:
        atomic_write_bytes(self.path, json.dumps(dict(schedule=self.schedule)).encode())


# ----------------------------------------------------------------------------- rollout level
_EPISODE_FIELDS = ("messages", "stats", "segments", "final_answer", "end_reason", "done", "phase",
                   "_pending_calls", "generated_tokens", "tool_state")


class RolloutCheckpoints:
    """Rollout-level checkpoints: episode state + sandbox snapshot ref, one file per rollout."""

    def __init__(self, root: str | pathlib.Path):
        self.root = pathlib.Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, slot: int, chain: int) -> pathlib.Path:
        return self.root / f"rollout_{int(slot):08d}_{int(chain):03d}.pkl"

    def save(self, slot: int, chain: int, episode, *, extra: dict | None = None) -> str:
        """Snapshot `episode.sandbox` and pickle the episode's state; returns the snapshot ref.

        Call between turns (no tool call pending execution) so the filesystem and the
        message history agree.
        """
        if getattr(episode, "_pending_calls", ()):
            raise ValueError("checkpoint between turns: a tool call is still pending")
        ref = episode.sandbox.snapshot(f"rollout-{slot}-{chain}-{episode.stats.get('turns', 0)}")
        state = {k: getattr(episode, k) for k in _EPISODE_FIELDS}
        blob = dict(slot=slot, chain=chain, snapshot=ref, backend=type(episode.sandbox).__name__,
                    task_id=getattr(episode.task, "id", ""), state=state, extra=dict(extra or {}))
        atomic_write_bytes(self.path(slot, chain), pickle.dumps(blob, protocol=pickle.HIGHEST_PROTOCOL))
        return ref

    def load(self, slot: int, chain: int) -> dict | None:
        p = self.path(slot, chain)
        if not p.exists():
            return None
        with open(p, "rb") as f:
            return pickle.load(f)

    def restore_episode(self, slot: int, chain: int, task, registry, tokenizer, cfg,
                        sandbox_from_snapshot: Callable[[str], Any]):
        """Rebuild the checkpointed `Episode` in a sandbox made by `sandbox_from_snapshot(ref)`
        (e.g. `DockerSandbox.from_snapshot`, or `LocalSandbox.create(template=ref)`); None if
        there is no checkpoint."""
        blob = self.load(slot, chain)
        if blob is None:
            return None
        sb = sandbox_from_snapshot(blob["snapshot"])
        # the constructor wires sandbox/registry/limits; then the saved state replaces its fresh one
        ep = Episode(task, sb, registry, tokenizer, cfg)
        for k, v in blob["state"].items():
            setattr(ep, k, v)
        ep.ctx.state = ep.tool_state   # tools must mutate the restored todo state
        return ep

    def discard(self, slot: int, chain: int) -> None:
        try:
            self.path(slot, chain).unlink()
        except FileNotFoundError:
            pass


def group_versions(trajectories) -> tuple[int, int]:
    """(min, max) policy version over the model tokens of the trajectories (-1 if none)."""
    vs = [np.asarray(s.policy_versions)[np.asarray(s.loss_mask, bool)] for t in trajectories for s in t.segments]
    vs = np.concatenate(vs) if vs else np.zeros((0,), np.int32)
    return (int(vs.min()), int(vs.max())) if vs.size else (-1, -1)
