"""Mesh axes and THE sharding rules: logical axis names -> mesh axes, per preset (docs/SPEC.md §2).

Mesh axes (always all four, size-1 axes are free)::

    data     pure data parallel: batch split, parameters replicated
    fsdp     data parallel with parameters / optimizer state split (ZeRO-3)
    expert   expert parallel for the routed-expert weights; for everything else it is one more
             data(-FSDP) axis, so EP is carved from DP capacity and never coupled to tensor parallelism
    context  context parallel: the sequence is split (zigzag layout, `horizon.parallel.context`);
             for parameters it is folded into FSDP (weights / optimizer state split over it too)

Dense and expert weights use **different shardings of the same devices** (docs/SPEC.md §2): a dense weight's
``embed`` (or ``vocab``/``heads``/``mlp``) axis is split over ``(fsdp, context, expert)``; an expert
weight ``[E, D, F]`` puts its ``expert`` axis on ``expert`` and its ``embed`` axis on the remaining
``(fsdp, context)``. Rules are resolved per array: each logical axis takes the mesh axes listed for it
that the array has not used yet and that divide the dimension (dropped from the end otherwise; the
table printed by `sharding_table` shows the outcome). Activations: batch over ``(data, fsdp, expert)``,
sequence over ``context``.

Code outside this module never writes a PartitionSpec except inside shard_map bodies
(`context.py`, `experts.py`), which use the axis constants below.

Multi-host: the same code runs on a GPU cluster after ``jax.distributed.initialize()`` (one process
per host, `jax.devices()` then lists all hosts' devices and `make_mesh` spans them). Feed each process
its local slice of the global batch with `jax.make_array_from_process_local_data(batch_sharding(mesh),
local_batch)`; see `tests/parallel/test_distributed.py` for a 2-process CPU run.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from horizon.model import transformer
from horizon.utils.config import need, need_int

DATA, FSDP, EXPERT, CONTEXT = "data", "fsdp", "expert", "context"
AXES = (DATA, FSDP, EXPERT, CONTEXT)
BATCH_AXES = (DATA, FSDP, EXPERT)  # activations' batch dim
SEQ_AXIS = CONTEXT                 # activations' sequence dim
TOKEN_AXES = BATCH_AXES + (SEQ_AXIS,)

# name -> mesh sizes (8 devices each; the CPU test mesh)
PRESETS: dict[str, dict[str, int]] = {
    "dp8": dict(data=8, fsdp=1, expert=1, context=1),
    "fsdp4xcp2": dict(data=1, fsdp=4, expert=1, context=2),
    "ep4xcp2": dict(data=1, fsdp=1, expert=4, context=2),
    "ep8": dict(data=1, fsdp=1, expert=8, context=1),
    "fsdp8": dict(data=1, fsdp=8, expert=1, context=1),
    "single": dict(data=1, fsdp=1, expert=1, context=1),
}

_SHARDED = (FSDP, CONTEXT, EXPERT)  # FSDP-style split of a dense weight: CP and EP folded in
# Logical axis -> candidate mesh axes (MaxText-style logical axis rules). "layers" (scan axis) and
# the small latent ranks stay replicated; "expert" goes to the expert axis first.
_FSDP_RULES: dict[str, tuple[str, ...]] = {
    "expert": (EXPERT,),
    "vocab": _SHARDED, "embed": _SHARDED, "heads": _SHARDED, "mlp": _SHARDED, "moe_mlp": _SHARDED,
    "mtp_in": _SHARDED,
    "layers": (), "q_lora": (), "kv_lora": (), "router_expert": (),
}
_REPLICATED_RULES: dict[str, tuple[str, ...]] = {k: () for k in _FSDP_RULES}
# Preset -> rules table (dp8 is plain DP: every parameter replicated).
RULES: dict[str, dict[str, tuple[str, ...]]] = {
    "dp8": _REPLICATED_RULES, "single": _REPLICATED_RULES,
    "fsdp4xcp2": _FSDP_RULES, "ep4xcp2": _FSDP_RULES, "ep8": _FSDP_RULES, "fsdp8": _FSDP_RULES,
}


def require_one_device(c) -> None:
    """Refuse a `mesh` section that asks for more than one device in a driver that does not build
    its mesh from the config yet (docs/SPEC.md §2; the experiments run on one device until they do): a
    mesh override there would be silently ignored. Raises `ConfigError` naming the field."""
    if "mesh" not in c:
        return
    m = c.mesh
    need(not m.preset, "mesh.preset", m.preset, "must be '' (this driver runs on one device; the mesh presets "
         "run in tests/parallel and benchmarks/parallel.py)")
    for k in AXES:
        need(int(m[k]) == 1, f"mesh.{k}", m[k], "must be 1 (this driver runs on one device)")


def validate_mesh(c, *, power_of_two_ranks: bool = False) -> None:
    """The `mesh` section of a driver that runs on it (docs/SPEC.md §2): a known preset or axis sizes >= 1,
    needing at most the devices this process has; with `power_of_two_ranks` (drivers that bucket
    batches to powers of two: RL, the sampler) a power-of-two data*fsdp*expert. Raises `ConfigError`
    naming the field."""
    m = c.mesh
    if m.preset:
        need(m.preset in PRESETS, "mesh.preset", m.preset, f"must be '' or one of {sorted(PRESETS)}")
    else:
        for a in AXES:
            need_int(m, a, "mesh", lo=1)
    n, have = math.prod(mesh_sizes(m).values()), jax.device_count()
    need(n <= have, "mesh.preset" if m.preset else "mesh", m.preset or mesh_sizes(m),
         f"needs {n} devices, this process has {have} (on CPU: XLA_FLAGS=--xla_force_host_platform_device_count={n})")
    nb = math.prod(mesh_sizes(m)[a] for a in BATCH_AXES)
    need(not power_of_two_ranks or nb & (nb - 1) == 0, "mesh.preset" if m.preset else "mesh", m.preset or mesh_sizes(m),
         f"needs a power-of-two data*fsdp*expert (got {nb}): batches are bucketed to powers of two")


def mesh_from_config(c) -> jax.sharding.Mesh:
    """The run's mesh from ``c.mesh`` over the first devices it needs (default: a 1-device mesh)."""
    n = math.prod(mesh_sizes(c.mesh).values())
    return make_mesh(c.mesh, jax.devices()[:n])


_RUN_MESHES: dict[tuple, jax.sharding.Mesh] = {}


def run_mesh(c) -> jax.sharding.Mesh | None:
    """The mesh a run's steps execute on, from ``c.mesh`` (docs/SPEC.md §2): None when the config has no
    `mesh` section or it asks for one device (the steps then jit for the default device), else
    `mesh_from_config`'s mesh, built once per axis-size tuple so every step of a run (trainer,
    sampler, SFT) sees the same `Mesh` object and jit caches hit."""
    if "mesh" not in c:
        return None
    sizes = mesh_sizes(c.mesh)
    if math.prod(sizes.values()) == 1:
        return None
    key = tuple(sizes[a] for a in AXES)
    if key not in _RUN_MESHES:
        _RUN_MESHES[key] = mesh_from_config(c)
    return _RUN_MESHES[key]


def data_ranks(c) -> int:
    """Data-parallel ranks of the run's mesh (the batch axes' size; 1 without a mesh)."""
    m = run_mesh(c)
    return 1 if m is None else axis_size(m, BATCH_AXES)


def mesh_sizes(mcfg: ml_collections.ConfigDict) -> dict[str, int]:
    """Axis sizes from ``cfg.mesh``: the preset's if ``mcfg.preset`` is set, else the explicit sizes."""
    preset = mcfg.get("preset", "")
    if preset:
        if preset not in PRESETS:
            raise ValueError(f"unknown mesh preset {preset!r}; expected one of {sorted(PRESETS)}")
        return dict(PRESETS[preset])
    sizes = {a: int(mcfg.get(a, 1)) for a in AXES}
    for a, n in sizes.items():
        if n < 1:
            raise ValueError(f"mesh.{a} must be >= 1, got {n}")
    return sizes


def rules_for(mcfg: ml_collections.ConfigDict) -> dict[str, tuple[str, ...]]:
    """The logical-axis rules table of the configured preset (FSDP rules for explicit sizes)."""
    preset = mcfg.get("preset", "")
    return RULES.get(preset, _FSDP_RULES)


def make_mesh(mcfg: ml_collections.ConfigDict, devices=None) -> jax.sharding.Mesh:
    """A 4-axis (data, fsdp, expert, context) mesh over `devices` (default: all), Auto axis types."""
    sizes = mesh_sizes(mcfg)
    n = math.prod(sizes.values())
    devices = list(jax.devices() if devices is None else devices)
    if n != len(devices):
        raise ValueError(f"mesh {sizes} needs {n} devices, have {len(devices)}")
    return jax.make_mesh(tuple(sizes[a] for a in AXES), AXES,
                         axis_types=(jax.sharding.AxisType.Auto,) * len(AXES), devices=devices)


def axis_size(mesh, names: tuple[str, ...]) -> int:
    """Devices along the mesh axes `names` (e.g. `BATCH_AXES`: the data-parallel ranks)."""
    return math.prod(mesh.shape[a] for a in names)


def logical_to_spec(logical: tuple[str | None, ...], shape: tuple[int, ...], rules: dict, mesh) -> P:
    """Resolve one array's logical axes into a PartitionSpec (first come first served, divisibility)."""
    if len(logical) != len(shape):
        raise ValueError(f"logical axes {logical} do not match shape {shape}")
    used: set[str] = set()
    out = []
    for name, dim in zip(logical, shape):
        if name is not None and name not in rules:
            raise ValueError(f"no sharding rule for logical axis {name!r}; known: {sorted(rules)}")
        cand = [a for a in (rules.get(name, ()) if name else ()) if a not in used and mesh.shape[a] > 1]
        while cand and dim % axis_size(mesh, tuple(cand)):
            cand.pop()
        used.update(cand)
        out.append(tuple(cand) if len(cand) > 1 else (cand[0] if cand else None))
    return P(*out)


def param_specs(params_or_shapes: Any, cfg: ml_collections.ConfigDict, mesh) -> Any:
    """PartitionSpec per parameter (tree like `params`), from `transformer.param_logical_axes`."""
    axes = transformer.param_logical_axes(cfg.model)
    rules = rules_for(cfg.mesh)
    return jax.tree.map(lambda ax, x: logical_to_spec(ax, tuple(x.shape), rules, mesh), axes, params_or_shapes,
                        is_leaf=lambda t: isinstance(t, tuple))


def param_shardings(params_or_shapes: Any, cfg: ml_collections.ConfigDict, mesh) -> Any:
    """NamedSharding pytree for `params` (arrays or `jax.ShapeDtypeStruct`s)."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs(params_or_shapes, cfg, mesh),
                        is_leaf=lambda s: isinstance(s, P))


def batch_sharding(mesh, ndim: int = 2, *, shard_seq: bool = False, batch_dim: int = 0) -> NamedSharding:
    """Sharding of a ``[batch, seq, ...]`` input: batch over (data, fsdp, expert); seq over context
    only if `shard_seq` (inputs arrive in natural order and are permuted to the zigzag layout inside).
    `batch_dim` > 0: the batch is that dim (e.g. rows of micro-batches ``[M, rows, S]``), the others
    replicated."""
    if batch_dim:
        spec = [None] * ndim
        spec[batch_dim] = BATCH_AXES
        return NamedSharding(mesh, P(*spec))
    spec = [BATCH_AXES, SEQ_AXIS if shard_seq else None] + [None] * (ndim - 2)
    return NamedSharding(mesh, P(*spec[:ndim]))


def replicated(mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def _path_keys(path) -> tuple:
    out = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                out.append(getattr(k, attr))
                break
    return tuple(out)


def tree_shardings_like_params(tree: Any, params_shardings: Any, mesh) -> Any:
    """Shardings for a state pytree (optimizer moments, ...): a leaf whose key path ends with a
    parameter's path and has its shape takes that parameter's sharding; everything else replicated."""
    by_path = {}
    for path, sh in jax.tree_util.tree_leaves_with_path(params_shardings,
                                                        is_leaf=lambda s: isinstance(s, NamedSharding)):
        by_path[_path_keys(path)] = sh
    maxlen = max((len(k) for k in by_path), default=0)

    def pick(path, leaf):
        keys = _path_keys(path)
        for n in range(min(maxlen, len(keys)), 0, -1):
            sh = by_path.get(keys[-n:])
            if sh is not None and len(sh.spec) <= len(getattr(leaf, "shape", ())):
                try:
                    sh.shard_shape(tuple(leaf.shape))
                    return sh
                except ValueError:
                    pass
        return replicated(mesh)

    return jax.tree_util.tree_map_with_path(pick, tree)


def shard_params(params: Any, cfg: ml_collections.ConfigDict, mesh) -> Any:
    """Place `params` on `mesh` with `param_shardings`."""
    return jax.device_put(params, param_shardings(params, cfg, mesh))


def sharding_table(params: Any, cfg: ml_collections.ConfigDict, mesh) -> str:
    """One line per parameter: path, shape, logical axes, PartitionSpec, per-device shard shape."""
    axes = transformer.param_logical_axes(cfg.model)
    specs = param_specs(params, cfg, mesh)
    rows = []
    flat_ax = jax.tree_util.tree_leaves_with_path(axes, is_leaf=lambda t: isinstance(t, tuple))
    flat_x = jax.tree.leaves(params)
    flat_s = jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, P))
    for (path, ax), x, s in zip(flat_ax, flat_x, flat_s):
        name = "/".join(str(k) for k in _path_keys(path))
        shard = NamedSharding(mesh, s).shard_shape(tuple(x.shape))
        rows.append(f"{name:<34} {str(tuple(x.shape)):<18} {str(ax):<42} {str(tuple(s)):<40} {shard}")
    head = f"mesh {dict(mesh.shape)}\n{'param':<34} {'shape':<18} {'logical':<42} {'spec':<40} shard"
    return "\n".join([head] + rows)


def bytes_per_device(tree: Any, shardings: Any) -> int:
    """Bytes one device holds for `tree` under `shardings` (for the memory column of the benchmark)."""
    tot = 0
    for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings, is_leaf=lambda s: isinstance(s, NamedSharding))):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            itemsize = 8  # a threefry key: 2 x uint32
        else:
            itemsize = np.dtype(x.dtype).itemsize
        tot += int(np.prod(s.shard_shape(tuple(x.shape)))) * itemsize
    return tot
