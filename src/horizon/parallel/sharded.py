"""The model on a (data, fsdp, expert, context) mesh (docs/SPEC.md §2): path choice, placement, forward.

`configure(cfg)` copies the config and selects the shard_map paths from ``cfg.mesh``:
``attention_impl = "context_parallel"`` when ``context > 1`` and ``moe_impl = "expert_parallel"``
when the model has experts and ``expert > 1`` or ``context > 1`` (the EP block keeps the MoE layer
local to each device's tokens; with ``expert == 1`` it does no all-to-all).

LM step with CP (`horizon.train.lm.make_train_step`, `mesh_losses`): the batch arrives in natural order,
sharded over the batch axes; inside the jitted step tokens, positions, segment ids and the loss mask are
permuted to the zigzag layout and constrained to ``P(batch, context)``; the model runs in that layout, the
next-token targets and MTP's shifted tokens / teacher states come from `context.zigzag_shift_left` (the
natural-order shift as one static gather on true positions), and the token-sum losses are permutation
invariant, so MTP co-trains under CP.

RL step (`horizon.rl.algo.trainer.train_step` with a mesh, from ``configure(cfg, cp_layout="natural")``
and `state_shardings`): its loss shifts logits in natural order, so with CP it runs the model with
``cp_layout = "natural"`` (the attention permutes around itself; correct, two extra reshuffles per
layer).

All step functions enter ``jax.set_mesh(mesh)`` so the shard_map bodies find the mesh.

Sampling (`horizon.inference.sampler.generate` with a config whose mesh has several devices) runs unchanged on
sharded inputs. Params are placed by the same rules (`place_params`), the padded prompt block, lengths and the
latent KV cache ``[L, b, slots, r]`` are split over the batch axes (the cache's ``r`` also over ``context``),
and the sampler's jitted prefill / decode step are then partitioned by GSPMD from those input shardings (FSDP
weights are all-gathered per layer; the cache stays batch-sharded across steps). Decode uses the **plain**
paths (``attention_impl = moe_impl = "local"``, `sampling_config`): a decode step has one token per row, so
there is no sequence to split over ``context`` (the context devices hold replicas of their batch shard's rows
and act as FSDP devices for the weights), and the EP shard_map is the training path.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from horizon.model import transformer
from horizon.parallel import context, experts  # noqa: F401  (register the shard_map implementations)
from horizon.parallel import mesh as pmesh


def _unlocked_copy(cfg) -> ml_collections.ConfigDict:
    """A plain, unlocked copy of a (possibly locked or frozen) config: the CLI locks every section."""
    return ml_collections.ConfigDict(cfg.to_dict())


def configure(cfg: ml_collections.ConfigDict, *, cp_layout: str = "zigzag") -> ml_collections.ConfigDict:
    """Copy of `cfg` with the model's attention / MoE implementations chosen from ``cfg.mesh``."""
    sizes = pmesh.mesh_sizes(cfg.mesh)
    c = _unlocked_copy(cfg)
    m = c.mesh
    with c.unlocked():
        c.model.attention_impl = context.IMPL_NAME if sizes["context"] > 1 else "local"
        use_ep = c.model.num_experts > 0 and (sizes["expert"] > 1 or sizes["context"] > 1)
        c.model.moe_impl = experts.IMPL_NAME if use_ep else "local"
        c.model.cp_layout = cp_layout
        c.model.ep_capacity_factor = float(m.get("capacity_factor", 0.0))
        c.model.ep_dispatch = str(m.get("ep_dispatch", "padded"))
        c.model.ep_payload = str(m.get("ep_payload", "compute"))
        c.model.ep_microbatches = int(m.get("ep_microbatches", 1))
    return c


def cp_size(cfg) -> int:
    return pmesh.mesh_sizes(cfg.mesh)["context"]


def state_shardings(state_shapes: Any, params_shapes: Any, cfg, mesh) -> Any:
    """Shardings of a train state: params by the rules, optimizer moments like their params."""
    ps = pmesh.param_shardings(params_shapes, cfg, mesh)
    return pmesh.tree_shardings_like_params(state_shapes, ps, mesh)


def with_mesh(fn: Callable, mesh) -> Callable:
    def run(*args):
        with jax.set_mesh(mesh):
            return fn(*args)

    def lower(*args):
        with jax.set_mesh(mesh):
            return fn.lower(*args)

    run.jitted, run.lower, run.mesh = fn, lower, mesh
    return run


def compiled_collectives(step: Callable, *args) -> dict[str, int]:
    """Per-device bytes of each collective in `step`'s compiled program for `args` (`collective_bytes`);
    the executable is cached, so a following call of `step` does not compile again."""
    return collective_bytes(step.lower(*args).compile().as_text())


def make_forward(cfg, mesh, params_shapes: Any):
    """Jitted sharded `transformer.forward(params, tokens, positions, segment_ids)` in natural order."""
    c = configure(cfg, cp_layout="natural")
    p_sh = pmesh.param_shardings(params_shapes, c, mesh)
    b_sh = pmesh.batch_sharding(mesh)

    def f(params, tokens, positions, segment_ids):
        return transformer.forward(params, tokens, cfg=c.model, positions=positions, segment_ids=segment_ids)

    fn = jax.jit(f, in_shardings=(p_sh, b_sh, b_sh, b_sh))
    return with_mesh(fn, mesh)


def sampling_config(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Copy of `cfg` for decoding under ``cfg.mesh``: plain attention / MoE (see module docstring)."""
    c = _unlocked_copy(cfg)
    with c.unlocked():
        c.model.attention_impl = "local"
        c.model.moe_impl = "local"
    return c


def place_params(params: Any, cfg: ml_collections.ConfigDict, mesh) -> Any:
    """`params` placed with the preset's rules (`mesh.param_shardings`): the trainer's and the
    sampler's layout (a no-op for params already there)."""
    return jax.device_put(params, pmesh.param_shardings(params, cfg, mesh))


def sampling_cache_spec(shape: tuple[int, ...], mesh) -> P:
    """The sampling layout of a latent-cache leaf ``[L, b, slots, r]``: its batch dim 1 split over the
    batch axes, its latent dim ``r`` also over ``context`` (when it divides), which is the layout GSPMD
    gives the decode step's updated cache, so a donated cache keeps one layout across steps and the
    context devices hold no replicas of it (`sampling_placer`, the rollout engine's slot cache)."""
    ncp = mesh.shape[pmesh.SEQ_AXIS]
    r = pmesh.SEQ_AXIS if len(shape) == 4 and ncp > 1 and shape[3] % ncp == 0 else None
    return P(*([None, pmesh.BATCH_AXES] + [None] * (len(shape) - 3) + [r]))


def sampling_cache_shardings(cache: Any, mesh) -> Any:
    """`NamedSharding` of every leaf of a latent cache (arrays or shapes) in the sampling layout
    (`sampling_cache_spec`); raises ValueError when a batch dim does not divide over the batch axes."""
    nb = pmesh.axis_size(mesh, pmesh.BATCH_AXES)

    def one(a):
        if a.shape[1] % nb:
            raise ValueError(f"sampling batch {a.shape} is not divisible by the mesh batch axes ({nb})")
        return NamedSharding(mesh, sampling_cache_spec(a.shape, mesh))

    return jax.tree.map(one, cache)


def constrain_sampling_cache(cache: Any, mesh) -> Any:
    """Inside a jitted function: pin every cache leaf to the sampling layout (`sampling_cache_spec`), so
    an output cache (a donated input updated by row gathers / scatters) comes out in the layout it went
    in and the next call neither reshards it nor recompiles. A no-op without a mesh (``mesh=None``)."""
    if mesh is None:
        return cache
    return jax.tree.map(lambda a: jax.lax.with_sharding_constraint(
        a, NamedSharding(mesh, sampling_cache_spec(a.shape, mesh))), cache)


def place_sampling_rows(tree: Any, mesh) -> Any:
    """Every array of `tree` split on its leading (batch / slot) dim over the batch axes (the sampler's
    tokens and lengths, the rollout engine's per-slot decode state); ValueError when it does not divide."""
    nb = pmesh.axis_size(mesh, pmesh.BATCH_AXES)

    def put(a):
        if a.shape[0] % nb:
            raise ValueError(f"sampling batch {a.shape} is not divisible by the mesh batch axes ({nb})")
        return jax.device_put(a, NamedSharding(mesh, P(*([pmesh.BATCH_AXES] + [None] * (a.ndim - 1)))))

    return jax.tree.map(put, tree)


def sampling_placer(mesh) -> Callable:
    """``place(cache, tokens, lengths)`` for `sampler.generate`: every array split on its batch dim
    over the batch axes (cache leaves ``[L, b, slots, r]``: dim 1, in `sampling_cache_spec`'s layout;
    tokens ``[b, p]``, lengths ``[b]``: dim 0; ``tokens`` may be ``[b]`` too)."""

    def place(cache, tokens, lengths):
        cache = jax.device_put(cache, sampling_cache_shardings(cache, mesh))
        tokens, lengths = place_sampling_rows((tokens, lengths), mesh)
        return cache, tokens, lengths

    return place


_COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
                "ragged-all-to-all")
_DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1, "f8e4m3fn": 1,
                "f8e8m0fnu": 1, "s64": 8, "f64": 8}


def collective_bytes(hlo_text: str) -> dict[str, int]:
    """Per-device bytes of every collective's RESULT in optimized (SPMD-partitioned) HLO text, by op.

    Counted once per op in the HLO (ops inside a while/scan body run once per iteration: the
    benchmark multiplies nothing, so layer-scanned collectives count once per layer group)."""
    out = {c: 0 for c in _COLLECTIVES}
    pat = re.compile(r"=\s+(\(.*?\)|\w+\[[\d,]*\](?:\{[^}]*\})?)\s+(" + "|".join(_COLLECTIVES) + r")(?:-start)?\(")
    for m in pat.finditer(hlo_text):
        total = 0
        for dt, dims in re.findall(r"(\w+)\[([\d,]*)\]", m.group(1)):
            n = 1
            for d in dims.split(","):
                if d:
                    n *= int(d)
            total += n * _DTYPE_BYTES.get(dt, 4)
        out[m.group(2)] += total
    return out
