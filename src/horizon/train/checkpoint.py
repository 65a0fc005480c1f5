"""Orbax checkpoints of the full training state for exact resume (SPEC §8).

A checkpoint at step k holds the `TrainState` pytree (step, params, opt_state, rng) and a
small JSON record (data position = next batch index, seed, anything else the caller adds).
Because batch k of the data pipeline is a pure function of (data config, k), the data
position is all the pipeline needs to resume; restoring the state and reading batch k
reproduces the uninterrupted run bit for bit. Orbax writes into a temporary directory
and renames it on commit, so a process killed mid-save leaves the previous checkpoint
as the latest one.
"""

from __future__ import annotations

import pathlib
from typing import Any

import jax
import orbax.checkpoint as ocp


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
            return False
        self._mngr.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(dict(meta))), force=True)
        self._mngr.wait_until_finished()
        return True

    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._mngr.all_steps())

    def restore(self, step: int, target: Any) -> tuple[Any, dict]:
        """Restore checkpoint `step` into the structure/dtypes of `target` (arrays or
        `jax.ShapeDtypeStruct`s, e.g. from `jax.eval_shape` of the init function) and onto its
        shardings where it has them: a state saved on one mesh restores onto another (SPEC §2)."""
        abstract = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))
            if hasattr(x, "shape") else x, target)
        out = self._mngr.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        return out["state"], dict(out["meta"])

    def restore_latest(self, target: Any) -> tuple[Any, dict] | None:
        """(state, meta) of the newest checkpoint, or None if there is none."""
        step = self.latest_step()
        return None if step is None else self.restore(step, target)

    def close(self) -> None:
        self._mngr.wait_until_finished()
        self._mngr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def restore_params(directory: str | pathlib.Path, model_cfg) -> tuple[Any, dict]:
    """(params, meta) of the newest step in a `Checkpointer` directory whose `state` item holds
    `params` (an lm TrainState, an RL RLState, or a dict): the one checkpoint-to-params loader
    (SFT warm starts, eval, the async runtime). The tree and every shape must match
    `model_cfg`'s params (one-line `ValueError` otherwise); values are cast to its dtypes.
    `FileNotFoundError` when the directory or its steps are missing. meta gets `step` and `source`."""
    from horizon.model import transformer

    path = pathlib.Path(directory).resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint dir {path} does not exist")
    mngr = ocp.CheckpointManager(path, item_names=("state", "meta"),
                                 item_handlers=dict(state=ocp.StandardCheckpointHandler(),
                                                    meta=ocp.JsonCheckpointHandler()))
    try:
        step = mngr.latest_step()
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
