"""Orbax checkpoints of the full training state for exact resume (docs/SPEC.md §8).

A checkpoint at step k holds the `TrainState` pytree (step, params, opt_state, rng) and a
small JSON record (data position = next batch index, seed, anything else the caller adds).
Because batch k of the data pipeline is a pure function of (data config, k), the data
position is all the pipeline needs to resume; restoring the state and reading batch k
reproduces the uninterrupted run bit for bit. Orbax writes into a temporary directory
and renames it on commit, so a process killed mid-save leaves the previous checkpoint
as the latest one.

Integrity (docs/SPEC.md §4.1 "Fault tolerance": integrity-checked on restore): orbax does not
checksum its data files (16 overwritten bytes restore as garbage values without an error), so every
committed step gets a manifest, `MANIFEST_NAME` in the step directory: relative path, size and sha256 of every
file of the step. `Checkpointer` saves synchronously and writes the manifest right after
`wait_until_finished`, i.e. once orbax has committed (renamed) the step; a process killed in
between leaves a committed step without a manifest. Every restore verifies the step first. A step
without a manifest (written before manifests existed, or killed in that window) is restored
unverified with a logged warning: backward compatible. A corrupt step (a listed file missing,
its size or sha256 different, or an unreadable manifest) is `CheckpointCorruptError` when the
caller named the step; "latest" restores (`restore_latest`, `restore_params`) log one line naming
the step and its first bad file and fall back to the newest intact older step, raising only when
no step is intact. `save` of a step number that exists but is corrupt replaces it (the run redoes
the steps it fell back over).
"""

from __future__ import annotations

import hashlib
import json
import logging
import pathlib
from collections.abc import Iterable
from typing import Any

import jax
import orbax.checkpoint as ocp

from horizon.model import transformer
from horizon.utils.files import TMP_MARK, atomic_write_bytes

log = logging.getLogger(__name__)

MANIFEST_NAME = "horizon_checksums.json"   # a file, not a directory: orbax takes only dirs as items
MANIFEST_FORMAT = 1                        # bump when the manifest's fields change


class CheckpointCorruptError(ValueError):
    """A checkpoint step whose files do not match its checksum manifest, or no intact step left."""


def _sha256(path: pathlib.Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _step_dir(directory: pathlib.Path, step: int) -> pathlib.Path:
    """Orbax's directory of `step` under its default step name format (the bare step number)."""
    return directory / str(step)


def _data_files(step_dir: pathlib.Path) -> list[pathlib.Path]:
    """Every file of a step except the manifest and leftovers of its atomic write, sorted."""
    return sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != MANIFEST_NAME
                  and not (p.name.startswith(f".{MANIFEST_NAME}") and TMP_MARK in p.name))


def write_manifest(step_dir: pathlib.Path) -> None:
    """Write the checksum manifest of a committed step (module docstring)."""
    files = {p.relative_to(step_dir).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)}
             for p in _data_files(step_dir)}
    body = {"format": MANIFEST_FORMAT, "algorithm": "sha256", "files": files}
    atomic_write_bytes(step_dir / MANIFEST_NAME, json.dumps(body, indent=1, sort_keys=True).encode())


def _first_bad_file(step_dir: pathlib.Path, files: dict) -> str | None:
    """'<relpath>: <why>' of the first listed file (path order) that is missing or differs; None if all match."""
    for rel in sorted(files):
        want, p = files[rel], step_dir / rel
        if not p.is_file():
            return f"{rel}: missing"
        if p.stat().st_size != want["size"]:
            return f"{rel}: size {p.stat().st_size} != {want['size']} in the manifest"
        if _sha256(p) != want["sha256"]:
            return f"{rel}: sha256 differs from the manifest"
    return None


def verify_step(directory: str | pathlib.Path, step: int) -> bool:
    """Check checkpoint `step` of `directory` against its manifest. True: intact; False: no manifest
    (unverified, allowed, warning logged); `CheckpointCorruptError` (one line: step, first bad file) otherwise."""
    step_dir = _step_dir(pathlib.Path(directory), step)
    manifest = step_dir / MANIFEST_NAME
    if not manifest.is_file():
        log.warning("checkpoint %s has no %s (written before checksum manifests): unverified, used as is",
                    step_dir, MANIFEST_NAME)
        return False
    try:
        body = json.loads(manifest.read_bytes())
        files = body["files"] if body.get("format") == MANIFEST_FORMAT else None
        bad = _first_bad_file(step_dir, files) if isinstance(files, dict) else f"{MANIFEST_NAME}: unknown format"
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        bad = f"{MANIFEST_NAME}: unreadable ({type(e).__name__})"
    if bad is not None:
        raise CheckpointCorruptError(f"checkpoint step {step} in {step_dir.parent} is corrupt: {bad}")
    return True


def latest_intact_step(directory: str | pathlib.Path, steps: Iterable[int]) -> int | None:
    """The newest of `steps` that verifies (or has no manifest), logging one line per corrupt newer
    step; None when `steps` is empty; `CheckpointCorruptError` naming every step when none is intact."""
    problems = []
    for step in sorted(steps, reverse=True):
        try:
            verify_step(directory, step)
            return step
        except CheckpointCorruptError as e:
            log.error("%s; trying an older step", e)
            problems.append(str(e))
    if problems:
        raise CheckpointCorruptError(f"no intact checkpoint in {directory}: " + "; ".join(problems))
    return None


class Checkpointer:
    """Thin wrapper over `ocp.CheckpointManager` (save every `every` steps, keep `keep`)."""

    def __init__(self, directory: str | pathlib.Path, *, every: int, keep: int):
        if every <= 0 or keep <= 0:
            raise ValueError(f"checkpoint every/keep must be > 0, got {every}, {keep}")
        self.directory = pathlib.Path(directory).resolve()
        self.every = every
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=False)
        self._mngr = ocp.CheckpointManager(self.directory, options=options,
                                           item_names=("state", "meta"))

    def should_save(self, step: int) -> bool:
        return step > 0 and step % self.every == 0

    def save(self, step: int, state: Any, meta: dict, *, force: bool = False) -> bool:
        """Save `state` (a pytree) and JSON `meta` as checkpoint `step`; blocks until written."""
        if not (force or self.should_save(step)):
            return False
        if step in self.all_steps():
            if self._intact(step):
                return False
            log.error("replacing corrupt checkpoint step %d in %s", step, self.directory)
            self._mngr.delete(step)
        self._mngr.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(dict(meta))), force=True)
        self._mngr.wait_until_finished()   # committed (renamed) on disk: now checksum it
        if jax.process_index() == 0:
            write_manifest(_step_dir(self.directory, step))
        return True

    def _intact(self, step: int) -> bool:
        """Whether existing `step` verifies (a step without a manifest counts as intact)."""
        try:
            verify_step(self.directory, step)
        except CheckpointCorruptError:
            return False
        return True

    def latest_step(self) -> int | None:
        """The newest step on disk, unverified (`restore_latest` skips corrupt ones)."""
        return self._mngr.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._mngr.all_steps())

    def restore(self, step: int, target: Any) -> tuple[Any, dict]:
        """Restore checkpoint `step` into the structure/dtypes of `target` (arrays or
        `jax.ShapeDtypeStruct`s, e.g. from `jax.eval_shape` of the init function) and onto its
        shardings where it has them: a state saved on one mesh restores onto another (docs/SPEC.md §2).
        The step is verified first: `CheckpointCorruptError` if it is corrupt (no fallback for a named step)."""
        verify_step(self.directory, step)
        return self._restore_unverified(step, target)

    def _restore_unverified(self, step: int, target: Any) -> tuple[Any, dict]:
        abstract = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))
            if hasattr(x, "shape") else x, target)
        out = self._mngr.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        return out["state"], dict(out["meta"])

    def restore_latest(self, target: Any) -> tuple[Any, dict] | None:
        """(state, meta) of the newest intact checkpoint (corrupt newer steps are logged and skipped,
        module docstring), or None if there is none; `CheckpointCorruptError` if every step is corrupt."""
        step = latest_intact_step(self.directory, self.all_steps())
        return None if step is None else self._restore_unverified(step, target)

    def close(self) -> None:
        self._mngr.wait_until_finished()
        self._mngr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def saved_steps(directory: str | pathlib.Path) -> list[int]:
    """The steps a `Checkpointer` directory holds (its numeric subdirectories, sorted; [] if none):
    a cheap listing for config checks, without opening a manager."""
    path = pathlib.Path(directory)
    return sorted(int(d.name) for d in path.iterdir() if d.is_dir() and d.name.isdigit()) if path.is_dir() else []


def _reader(path: pathlib.Path) -> ocp.CheckpointManager:
    """A read-only manager of a `Checkpointer` directory's ``state`` and ``meta`` items (the caller closes it)."""
    return ocp.CheckpointManager(path, item_names=("state", "meta"),
                                 item_handlers=dict(state=ocp.StandardCheckpointHandler(),
                                                    meta=ocp.JsonCheckpointHandler()))


def init_checkpoint_step(model_cfg) -> int:
    """The step `model.init_checkpoint` names: `model.init_step`, or with -1 the directory's newest."""
    step = int(model_cfg.get("init_step", -1))
    return step if step >= 0 else max(saved_steps(str(model_cfg.init_checkpoint)), default=-1)


def restore_meta(directory: str | pathlib.Path, step: int) -> dict:
    """The JSON meta saved with `step` (e.g. ``data_step``, ``eval_loss``: `horizon.train.loop`), without its state."""
    mngr = _reader(pathlib.Path(directory).resolve())
    try:
        raw = mngr.restore(int(step), args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    finally:
        mngr.close()
    return dict(raw["meta"] or {})


def restore_params(directory: str | pathlib.Path, model_cfg, *, step: int | None = None) -> tuple[Any, dict]:
    """(params, meta) of one step in a `Checkpointer` directory whose `state` item holds
    `params` (an lm TrainState, an RL RLState, or a dict): the one checkpoint-to-params loader
    (SFT warm starts, eval, the async runtime, `model.init_checkpoint`). The tree and every shape must match
    `model_cfg`'s params (one-line `ValueError` otherwise); values are cast to its dtypes.
    `FileNotFoundError` when the directory or its steps (or `step`) are missing. Without `step` the newest
    intact step is read (`latest_intact_step`; `CheckpointCorruptError` if none); `step` is verified
    (`verify_step`). meta gets `step` and `source`."""
    path = pathlib.Path(directory).resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint dir {path} does not exist")
    mngr = _reader(path)
    try:
        if step is None:
            step = latest_intact_step(path, mngr.all_steps())   # corrupt newer steps: logged, skipped
        elif int(step) not in mngr.all_steps():
            raise FileNotFoundError(f"no checkpoint step {step} in {path} (it holds {sorted(mngr.all_steps())})")
        else:
            verify_step(path, int(step))
        if step is None:
            raise FileNotFoundError(f"no checkpoint steps in {path}")
        # onto this process's default device, whatever mesh wrote it (the caller's run places the
        # params on its own mesh: trainer.init_state, the sampler)
        dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=dev),
                              mngr.item_metadata(step)["state"].tree)
        raw = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                                         meta=ocp.args.JsonRestore()))
    finally:
        mngr.close()
    state, meta = raw["state"], dict(raw["meta"] or {})
    params = state["params"] if isinstance(state, dict) else state.params
    abstract = jax.eval_shape(lambda k: transformer.init(k, model_cfg), jax.random.key(0))
    if jax.tree.structure(params) != jax.tree.structure(abstract):
        raise ValueError(f"checkpoint {path}/{step} params do not match the model config's param tree")
    bad = [(a.shape, b.shape) for a, b in zip(jax.tree.leaves(abstract), jax.tree.leaves(params)) if a.shape != b.shape]
    if bad:
        raise ValueError(f"checkpoint {path}/{step} param shapes differ from the model config: {bad[:3]}")
    params = jax.tree.map(lambda a, x: jax.numpy.asarray(x, a.dtype), abstract, params)
    return params, dict(meta, step=int(step), source=str(path))
