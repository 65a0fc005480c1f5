"""RL train step: router-replayed forward, Dr.GRPO policy gradient with KL, Adam (docs/SPEC.md §4).

One step on a batch from `horizon.rl.algo.batch.build_batch`:

1. Router replay (docs/SPEC.md §1, §4.1): tokens with recorded inference experts use them; tokens
   without a record (prompt, observations, padding: index -1) take the router's own choice,
   read from a first forward without replay (no gradient). The replayed forward then
   computes the gate weights from the current router scores, so the router is trained.
   (The two-pass fill exists because `moe.route` has no per-token "no replay" marker.)
2. Token log-probs of the targets at temperature 1: ``logp[:, t] = log_softmax(logits[:, t-1])
   [tokens[:, t]]`` (column 0 = 0, never masked in) — the same quantity the sampler
   records, so the importance ratio compares like with like. The head runs over token chunks
   from the trunk's hidden states (`policy_logprobs`, `horizon.model.head`): no full logits.
3. `losses.policy_gradient_loss` with the `c.rl` options (`losses.loss_config`); the
   reference policy (if any) runs with its own routing, detached. With ``loss_agg ==
   "token_sum"`` and no explicit ``token_sum_norm`` the loss is divided by the number of *real*
   rows (bucketing pads rows, and the padded count must not change the step size).
4. Gradient accumulation (optional): a batch split by `batch.split_microbatches` (leading
   micro-batch axis, whole chains per micro-batch) runs steps 1-3 one micro-batch at a time, each
   cut to a length bucket of a set fixed by the config, and sums the gradients weighted to the
   whole batch's loss normalisation (`horizon.rl.algo.accumulate`): the same update as one pass,
   with one micro-batch's activations, and a few compiled shapes per run, not one per step.
5. Adam on all trainable params (`horizon.train.optim.make_optimizer` with the model's
   `trainable_mask`, which excludes `router_bias`) with global-norm clipping, then the
   aux-loss-free router-bias update from the router load over real tokens only.

Mesh (docs/SPEC.md §2). The same step serves every mesh: with a config whose ``mesh`` asks for several
devices (`horizon.parallel.mesh.run_mesh`), `init_state` places the state by the one rules table
(optimizer moments like their params), `train_step` places the batch's rows over the data-parallel
ranks (`batch_shardings`) and runs the jitted step under that mesh with the attention / MoE
implementations the mesh selects (`horizon.parallel.sharded.configure`, natural CP layout); the
new state keeps the input's shardings.

Metrics: reward mean, best-of-K (max reward per group, averaged), KL estimates, entropy of the
trained positions, clip fraction, token counts, grad norm, staleness (policy versions).
Stale tokens: the loss's corrections (`rl.stale`: truncated importance sampling, token / sequence
ratio masks; `losses` module docstring) log
``stale/masked_token_fraction``, ``stale/tis_clipped_fraction`` and ``stale/mean_ratio``; the step
adds the lag histogram `version_lag_counts` (``stale/lag_0`` .. ``stale/lag_7``,
``stale/lag_8plus``: loss-token counts by ``state.step - policy_versions``; ``state.step`` = t is
the version of the params step t trains, as `runtime.processes.token_staleness` counts it). Every
metric is a scalar (`runtime.core.train_groups` logs floats).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jaxtyping import Array, Bool, Float, Int

from horizon.model import head, moe, transformer
from horizon.parallel import mesh as pmesh
from horizon.parallel import sharded
from horizon.rl.algo import accumulate, losses, routing
from horizon.rl.algo.batch import ROW_FIELDS
from horizon.train import optim


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class RLState:
    """Trainer state pytree. `ref_params` is None when no KL reference is kept."""

    step: jax.Array
    params: Any
    opt_state: Any
    ref_params: Any = None


def make_optimizer(params, cfg) -> optax.GradientTransformation:
    """Adam (+ optional decay) on trainable leaves, clipping; fields from `c.rl.optim` (docs/SPEC.md §4)."""
    return optim.make_optimizer(cfg.rl.optim, transformer.trainable_mask(params))


def init_state(params, cfg, *, ref_params=None) -> RLState:
    """Fresh state. With `c.rl.use_reference` and no `ref_params` given, the reference is a
    frozen copy of `params` (the RL starting point, usually the SFT checkpoint)."""
    if ref_params is None and bool(cfg.rl.use_reference) and float(cfg.rl.kl_coef) > 0:
        ref_params = jax.tree.map(jnp.copy, params)
    opt_state = make_optimizer(params, cfg).init(params)
    return place_state(RLState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt_state,
                               ref_params=ref_params), cfg)


def state_shardings(state, cfg, mesh):
    """Shardings of an `RLState` (arrays or shapes) on `mesh`: params and reference by the rules
    table, optimizer moments like their params, the step replicated."""
    return sharded.state_shardings(state, state.params, cfg, mesh)


def place_state(state: RLState, cfg) -> RLState:
    """`state` on the run's mesh (`state_shardings`), or without one committed to the default device
    (so every step's state is placed alike and each shape compiles once: `horizon.rl.runtime.warmup`).
    Also the restore target of a checkpoint: orbax then reads each array onto these shardings,
    whatever the mesh the checkpoint was saved from."""
    mesh = pmesh.run_mesh(cfg)
    if mesh is None:
        return jax.device_put(state, jax.devices()[0])
    return jax.device_put(state, state_shardings(state, cfg, mesh))


def batch_shardings(batch: dict, mesh) -> dict:
    """The RL batch on `mesh`: row fields (`ROW_FIELDS`, rows = dim 0, or dim 1 of micro-batches
    ``[M, rows, S]``) split over the data-parallel ranks, replay indices on their token dim
    (row-major, so the same rows), group-level arrays replicated. Rows must divide evenly."""
    ax = 1 if batch["tokens"].ndim == 3 else 0
    rows, nb = batch["tokens"].shape[ax], pmesh.axis_size(mesh, pmesh.BATCH_AXES)
    if rows % nb:
        raise ValueError(f"{rows} batch rows do not split over {nb} data-parallel ranks: rl.batch.min_rows "
                         f"(and micro_rows) must be multiples of {nb}")
    out = {}
    for k, v in batch.items():
        nd = len(v.shape)
        if k == "replay_indices":
            out[k] = pmesh.batch_sharding(mesh, nd, batch_dim=ax + 1)
        elif k in ROW_FIELDS:
            out[k] = pmesh.batch_sharding(mesh, nd, batch_dim=ax)
        else:
            out[k] = pmesh.replicated(mesh)
    return out


def token_logprobs(
    logits: Float[Array, "r s v"], tokens: Int[Array, "r s"]
) -> tuple[Float[Array, "r s"], Float[Array, "r s"]]:
    """(log-prob of token t under logits[t-1], entropy of that distribution); column 0 is 0. The
    full-logits form of `policy_logprobs` (tests and checks that have logits)."""
    tgt, ent = head.logit_stats(logits[:, :-1], tokens[:, 1:])
    return _shift_right(tgt), _shift_right(ent)


def policy_logprobs(
    params, hidden: Float[Array, "r s d"], tokens: Int[Array, "r s"], *, cfg
) -> tuple[Float[Array, "r s"], Float[Array, "r s"]]:
    """`token_logprobs` from the trunk's `hidden` states (`transformer.hidden_states`): token t under
    the head at t-1, over token chunks (`horizon.model.head`), no [rows, seq, vocab] logits."""
    tgt = jnp.concatenate([tokens[:, 1:], jnp.zeros_like(tokens[:, :1])], axis=1)
    lp, ent = head.token_logprobs(params, hidden, tgt, cfg=cfg.model)
    return _shift_right(lp[:, :-1]), _shift_right(ent[:, :-1])


def _shift_right(x: Array) -> Array:
    """[r, s-1] values of tokens 1..s-1 -> [r, s] with column 0 = 0."""
    return jnp.concatenate([jnp.zeros((x.shape[0], 1), jnp.float32), x.astype(jnp.float32)], axis=1)


def masked_router_load(indices: Int[Array, "l t k"], valid: Float[Array, " t"], num_experts: int):
    """Per-layer expert load [L_moe, E] counting only real tokens (padding excluded)."""
    w = jnp.broadcast_to(valid[None, :, None], indices.shape).astype(jnp.float32)
    return jax.vmap(lambda i, wi: jnp.bincount(i.reshape(-1), weights=wi.reshape(-1), length=num_experts))(indices, w)


def loss_from_logits(logits, batch, *, cfg, ref_logits=None):
    """The RL loss given trainer logits (tests differentiate it w.r.t. logits); the step itself runs
    `loss_from_logprobs` on the chunked head's log-probs (`rl_loss`)."""
    lp, ent = token_logprobs(logits, batch["tokens"])
    ref_lp = None if ref_logits is None else token_logprobs(ref_logits, batch["tokens"])[0]
    return loss_from_logprobs(lp, ent, batch, cfg=cfg, ref_logprobs=ref_lp)


def loss_from_logprobs(
    lp: Float[Array, "r s"], ent: Float[Array, "r s"], batch: dict, *, cfg,
    ref_logprobs: Float[Array, "r s"] | None = None,
) -> tuple[Float[Array, ""], dict]:
    """The RL loss given the policy's token log-probs and entropies (`policy_logprobs`) and the
    reference's log-probs (detached here; None: no KL). Returns (loss, metrics)."""
    rl = cfg.rl
    ref_lp = None if ref_logprobs is None else jax.lax.stop_gradient(ref_logprobs)
    lc = losses.loss_config(rl)
    if ref_lp is None:
        lc = dataclasses.replace(lc, kl_coef=0.0)
    rows_real = jnp.maximum(jnp.sum(batch["row_chain"] >= 0), 1).astype(jnp.float32)
    seg = dict(row_chain_index=batch["row_chain"], row_segment_index=batch["row_segment"]) \
        if bool(rl.kl_across_segments) else {}
    loss, m = losses.policy_gradient_loss(
        lp, batch["sampler_logprobs"], batch["advantages"], batch["loss_mask"], lc,
        truncated=batch["truncated"], ref_logprobs=ref_lp, **seg)
    if lc.agg == "token_sum" and not lc.token_sum_norm:
        scale = lp.shape[0] / rows_real     # divide by real rows, not the padded bucket
        loss = loss * scale
        m = dict(m, loss=m["loss"] * scale, pg_loss=m["pg_loss"] * scale, kl_loss=m["kl_loss"] * scale)
    mask = batch["loss_mask"].astype(jnp.float32)
    m["entropy"] = jax.lax.stop_gradient(jnp.sum(ent * mask) / jnp.maximum(mask.sum(), 1.0))
    m["logprob_mean"] = jax.lax.stop_gradient(jnp.sum(lp * mask) / jnp.maximum(mask.sum(), 1.0))
    gap = jax.lax.stop_gradient(jnp.abs(lp - batch["sampler_logprobs"]))
    m["sampler_logprob_diff"] = jnp.sum(gap * mask) / jnp.maximum(mask.sum(), 1.0)
    m["sampler_logprob_diff_max"] = jnp.max(gap * mask)
    return loss, m


def rl_loss(params, batch, *, cfg, ref_params=None, replay=None):
    """Trunk (with replay indices if given), the head's log-probs and entropies over token chunks,
    the reference's log-probs (its own routing, detached), then `loss_from_logprobs`. No full
    logits. Returns (loss, (metrics, aux))."""
    tokens = batch["tokens"]
    hidden, aux = transformer.hidden_states(params, tokens, cfg=cfg.model, replay_indices=replay)
    lp, ent = policy_logprobs(params, hidden, tokens, cfg=cfg)
    ref_lp = None
    if ref_params is not None:  # init_state keeps one only when kl_coef > 0
        ref = jax.lax.stop_gradient(ref_params)
        ref_hidden, _ = transformer.hidden_states(ref, tokens, cfg=cfg.model)
        ref_lp = policy_logprobs(ref, ref_hidden, tokens, cfg=cfg)[0]
    loss, m = loss_from_logprobs(lp, ent, batch, cfg=cfg, ref_logprobs=ref_lp)
    return loss, (m, aux)


def _reward_metrics(batch) -> dict:
    gv = batch["group_valid"].astype(jnp.float32)
    n = jnp.maximum(gv.sum(), 1.0)
    r = batch["group_rewards"]
    return dict(reward_mean=jnp.sum(r.mean(axis=1) * gv) / n,
                best_of_k=losses.mean_group_max(r, gv),
                reward_std=jnp.sum(r.std(axis=1) * gv) / n)


def _loss_grads_load(params, ref_params, batch: dict, *, cfg):
    """(metrics, grads, router load [L_moe, E] or None) of one batch or micro-batch."""
    rl = cfg.rl
    recorded = batch["replay_indices"]
    replay, own = routing.replay_for(params, batch["tokens"], recorded, cfg=cfg)
    grad_fn = jax.value_and_grad(rl_loss, has_aux=True)
    (_, (m, aux)), grads = grad_fn(params, batch, cfg=cfg, ref_params=ref_params, replay=replay)
    if recorded.shape[0] > 0:     # the trainer's own routing vs the sampler's, and the routing it trained with
        trained = aux["router_indices"]
        m["routing/own_vs_sampler"] = routing.disagreement(trained if own is None else own, recorded,
                                                           batch["loss_mask"])
        m["routing/trained_vs_sampler"] = routing.disagreement(trained, recorded, batch["loss_mask"])
    load = None
    if bool(rl.update_router_bias) and transformer.layer_counts(cfg.model)[1] > 0:
        load = masked_router_load(aux["router_indices"], batch["valid"].reshape(-1), cfg.model.num_experts)
    return m, grads, load


LAG_BINS = 8      # version-lag histogram: lags 0 .. LAG_BINS-1, then one ">= LAG_BINS" bin


def version_lag_counts(policy_versions: Int[Array, "*rows seq"], loss_mask: Bool[Array, "*rows seq"],
                       step: Int[Array, ""] | int) -> dict[str, Float[Array, ""]]:
    """Staleness histogram of the trained tokens: {``stale/lag_<j>``: count of
    loss tokens whose lag ``step - policy_version`` is j} for j < `LAG_BINS`, and
    ``stale/lag_<LAG_BINS>plus`` for the rest. A version newer than `step` (not produced by the
    loops, whose admission keeps lags >= 0) counts as lag 0. Any leading shape (whole or split
    batch): the counts are over every token."""
    lag = jnp.clip(jnp.asarray(step, jnp.int32) - policy_versions.astype(jnp.int32), 0, LAG_BINS)
    w = loss_mask.astype(jnp.float32)
    out = {f"stale/lag_{j}": jnp.sum(jnp.where(lag == j, w, 0.0)) for j in range(LAG_BINS)}
    out[f"stale/lag_{LAG_BINS}plus"] = jnp.sum(jnp.where(lag == LAG_BINS, w, 0.0))
    return out


def batch_counts(batch: dict, step) -> dict:
    """Counts over a batch or micro-batch that the step reports (summed over micro-batches, the
    version minimised): real tokens and rows, the oldest trained token's policy version, and the
    staleness histogram (`version_lag_counts`) at `step`."""
    mask = batch["loss_mask"]
    vers = jnp.where(mask, batch["policy_versions"], jnp.iinfo(jnp.int32).max)
    return dict(tokens=jnp.sum(batch["valid"]).astype(jnp.float32),
                rows=jnp.sum(batch["row_chain"] >= 0).astype(jnp.float32),
                min_policy_version=jnp.min(vers).astype(jnp.float32),
                **version_lag_counts(batch["policy_versions"], mask, step))


def apply_grads(state: RLState, grads, load, *, cfg) -> tuple[RLState, dict]:
    """Adam on the trainable leaves (clipped), then the router-bias update from `load` (None: none).
    Returns (the next state, {"grad_norm"})."""
    trainable = transformer.trainable_mask(state.params)
    gnorm = optax.tree.norm(jax.tree.map(lambda g, t: g if t else jnp.zeros_like(g), grads, trainable))
    tx = make_optimizer(state.params, cfg)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    if load is not None:
        params = moe.update_router_bias(params, load, cfg.model)
    new = RLState(step=state.step + 1, params=params, opt_state=opt_state, ref_params=state.ref_params)
    return new, dict(grad_norm=gnorm)


def pure_train_step(state: RLState, batch: dict, *, cfg) -> tuple[RLState, dict]:
    """The RL step on a whole (unsplit) batch as a pure function of (state, batch) for a frozen `cfg`
    (`train_step` jits it, for one device or a mesh). A split batch trains micro-batch by
    micro-batch (`train_step`, `horizon.rl.algo.accumulate`) to the same update."""
    m, grads, load = _loss_grads_load(state.params, state.ref_params, batch, cfg=cfg)
    new, mg = apply_grads(state, grads, load, cfg=cfg)
    return new, dict(m, **mg, **_reward_metrics(batch), **batch_counts(batch, state.step),
                     microbatches=jnp.asarray(1.0, jnp.float32))


@functools.partial(jax.jit, static_argnames=("cfg", "mesh"), donate_argnames=("state",))
def _train_step_jit(state, batch, *, cfg, mesh=None):
    new, m = pure_train_step(state, batch, cfg=cfg)
    if mesh is not None:            # the new state keeps the rules' layout (the next step's input)
        new = jax.lax.with_sharding_constraint(new, state_shardings(new, cfg, mesh))
    return new, m


STEP_SECTIONS = ("model", "rl", "mesh")   # all the jitted step reads of a run's config


def step_config(cfg) -> ml_collections.FrozenConfigDict:
    """The jitted step's static config: only `STEP_SECTIONS`, frozen (hashable by value). Runs that
    differ elsewhere (a study's strategies and seeds: `agent`, `exp`, `seed`) share one compiled
    step instead of each keeping its own executables alive in the jit cache for the process's life
    (each holds ~10^3 memory mappings on CPU; a 3-seed study ran into Linux's 65530, docs/PERF.md)."""
    return ml_collections.FrozenConfigDict({k: cfg[k] for k in STEP_SECTIONS if k in cfg})


def _mesh_and_config(cfg):
    """(the run's mesh or None, the jitted steps' frozen config on it)."""
    mesh = pmesh.run_mesh(cfg)
    return mesh, step_config(cfg if mesh is None else sharded.configure(cfg, cp_layout="natural"))


def _under(mesh):
    """The context every jitted step runs and lowers in: the run's mesh, or none."""
    return contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)


def _step_args(state, batch: dict, cfg):
    """(mesh or None, frozen step config, placed batch) of a `train_step` call. A batch of
    `jax.ShapeDtypeStruct`s (an abstract step, `compile_train_step`) gets the shardings instead."""
    mesh, frozen = _mesh_and_config(cfg)
    abstract = any(isinstance(v, jax.ShapeDtypeStruct) for v in batch.values())
    if mesh is None:
        return None, frozen, dict(batch) if abstract else {k: jnp.asarray(v) for k, v in batch.items()}
    sh = batch_shardings(batch, mesh)
    if abstract:
        return mesh, frozen, {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sh[k]) for k, v in batch.items()}
    return mesh, frozen, jax.device_put(dict(batch), sh)


@functools.partial(jax.jit, static_argnames=("cfg", "mesh"), donate_argnames=("acc",))
def _micro_step_jit(params, ref_params, acc, mb, w, step, *, cfg, mesh=None):
    """One micro-batch of an accumulated step: ``acc = (grads, router load)`` plus `w` x its gradients
    and its load; returns (acc, its metrics and `batch_counts`)."""
    m, g, load = _loss_grads_load(params, ref_params, mb, cfg=cfg)
    grads = jax.tree.map(lambda a, b: a + w * b, acc[0], g)
    load = None if load is None else acc[1] + load
    if mesh is not None:            # the accumulator keeps its layout (`_zero_acc`)
        grads = jax.lax.with_sharding_constraint(grads, sharded.state_shardings(grads, params, cfg, mesh))
        load = None if load is None else jax.lax.with_sharding_constraint(load, pmesh.replicated(mesh))
    return (grads, load), dict(m, **batch_counts(mb, step))


@functools.partial(jax.jit, static_argnames=("cfg", "mesh"), donate_argnames=("state",))
def _apply_jit(state, acc, groups, *, cfg, mesh=None):
    new, m = apply_grads(state, acc[0], acc[1], cfg=cfg)
    if mesh is not None:
        new = jax.lax.with_sharding_constraint(new, state_shardings(new, cfg, mesh))
    return new, dict(m, **_reward_metrics(groups))


GROUP_FIELDS = ("chain_advantages", "group_rewards", "group_valid")


def _zero_acc(params, cfg, mesh=None):
    """Zero gradients (laid out like the params) and, with the router-bias update, a zero load placed
    as the micro-batch step returns it (`_load_home`), so every micro-batch's call has one signature."""
    L = transformer.layer_counts(cfg.model)[1]
    load = None
    if bool(cfg.rl.update_router_bias) and L > 0:
        load = jnp.zeros((L, int(cfg.model.num_experts)), jnp.float32)
        home = _load_home(params, mesh)
        load = load if home is None else jax.device_put(load, home)
    return jax.tree.map(jnp.zeros_like, params), load


def _load_home(params, mesh):
    """Where the accumulated router load lives: replicated on a mesh, else with the params."""
    if mesh is not None:
        return pmesh.replicated(mesh)
    return getattr(jax.tree.leaves(params)[0], "sharding", None)


def _place(batch: dict, mesh) -> dict:
    """A (micro-)batch on the device, or with a mesh its rows over the data-parallel ranks."""
    if mesh is None:
        return {k: jnp.asarray(v) for k, v in batch.items()}
    return jax.device_put(dict(batch), batch_shardings(batch, mesh))


def accumulate_grads(params, ref_params, batch: dict, *, cfg, step=0):
    """(metrics, gradients, router load or None) of a split batch ([M, rows, S], numpy), one
    micro-batch at a time (`horizon.rl.algo.accumulate`): each cut to its length bucket, its
    gradients added with its share of the loss; the metrics are host floats, combined as the
    one-pass step reports them. On the run's mesh if `cfg.mesh` asks for one (call it under
    ``jax.set_mesh``, as `train_step` does)."""
    mesh, frozen = _mesh_and_config(cfg)
    M = int(batch["tokens"].shape[0])
    w = accumulate.weights(batch, cfg)
    buckets = accumulate.seq_buckets(cfg)
    acc = _zero_acc(params, cfg, mesh)
    outs = []
    for i in range(M):
        mb = _place(accumulate.micro_batch(batch, i, buckets), mesh)
        acc, mi = _micro_step_jit(params, ref_params, acc, mb, np.float32(w[i]), step, cfg=frozen, mesh=mesh)
        outs.append(mi)
    mask = np.asarray(batch["loss_mask"], np.float32).sum(axis=(1, 2))
    parts = [{k: float(v) for k, v in x.items()} for x in jax.device_get(outs)]
    return dict(accumulate.combine(parts, w, mask), microbatches=float(M)), acc[0], acc[1]


def _accumulated_step(state: RLState, batch: dict, cfg) -> tuple[RLState, dict]:
    """A split batch: `accumulate_grads`, then one jitted update (`apply_grads`)."""
    mesh, frozen = _mesh_and_config(cfg)
    m, grads, load = accumulate_grads(state.params, state.ref_params, batch, cfg=cfg, step=state.step)
    groups = {k: np.asarray(batch[k]) for k in GROUP_FIELDS}
    if mesh is not None:
        groups = jax.device_put(groups, pmesh.replicated(mesh))
    state, mu = _apply_jit(state, (grads, load), groups, cfg=frozen, mesh=mesh)
    return state, dict({k: float(v) for k, v in jax.device_get(mu).items()}, **m)


def train_step(state: RLState, batch: dict, *, cfg) -> tuple[RLState, dict]:
    """One RL step (module docstring), on the run's mesh if `cfg.mesh` asks for one (the state from
    `init_state` / `place_state`). `cfg` is the full config (model + rl); the input `state` is donated.
    `batch` is `build_batch`'s dict (numpy or jax arrays): a whole batch runs as one jitted step, a
    split one ([M, rows, S]) as M jitted micro-batch steps of bounded shapes and one update."""
    if np.ndim(batch["tokens"]) == 3:
        with _under(pmesh.run_mesh(cfg)):
            return _accumulated_step(state, batch, cfg)
    mesh, frozen, b = _step_args(state, batch, cfg)
    with _under(mesh):
        return _train_step_jit(state, b, cfg=frozen, mesh=mesh)


def compile_train_step(state: RLState, batch: dict, *, cfg):
    """Ahead-of-time compiled `train_step` for this state and batch shape (for memory, cost and
    collective analysis: `.memory_analysis()`, `.cost_analysis()`, `.as_text()`). `state` and
    `batch` may be abstract (`jax.ShapeDtypeStruct` leaves, placed on the run's mesh for a state:
    `horizon.rl.runtime.memory.abstract_state`): nothing is allocated. For a split batch it is the
    micro-batch step at the batch's length (the step's memory peak: one micro-batch's activations
    beside the params, reference and gradient accumulator; the optimizer state is not among its
    arguments, `horizon.rl.runtime.memory` adds it)."""
    mesh, frozen, b = _step_args(state, batch, cfg)
    if b["tokens"].ndim == 3:
        mb = {k: jax.ShapeDtypeStruct(v.shape[1:], v.dtype, sharding=_drop_lead(v, mesh))
              for k, v in b.items() if k in ROW_FIELDS or k == "replay_indices"}
        acc = _abstract_acc(state, cfg, frozen, mesh)
        args = (state.params, state.ref_params, acc, mb, jax.ShapeDtypeStruct((), jnp.float32), state.step)
        with _under(mesh):
            return _micro_step_jit.lower(*args, cfg=frozen, mesh=mesh).compile()
    with _under(mesh):
        return _train_step_jit.lower(state, b, cfg=frozen, mesh=mesh).compile()


def compile_apply(state: RLState, batch: dict, *, cfg):
    """Ahead-of-time compiled update step of an accumulated `train_step` (its shapes: the state's and
    the batch's group fields, whatever the micro-batches), e.g. to warm it up before a run."""
    mesh, frozen, b = _step_args(state, batch, cfg)
    acc = _abstract_acc(state, cfg, frozen, mesh)
    rep = None if mesh is None else pmesh.replicated(mesh)
    groups = {k: jax.ShapeDtypeStruct(b[k].shape, b[k].dtype, sharding=rep) for k in GROUP_FIELDS}
    with _under(mesh):
        return _apply_jit.lower(state, acc, groups, cfg=frozen, mesh=mesh).compile()


def _abstract_acc(state: RLState, cfg, frozen, mesh):
    """The accumulator `_zero_acc` makes, as shapes (laid out like the params on a mesh)."""
    grads, load = jax.eval_shape(lambda: _zero_acc(state.params, cfg))
    if mesh is None:       # zeros_like places the gradients like their params
        sh = jax.tree.map(lambda p: getattr(p, "sharding", None), state.params)
    else:
        sh = sharded.state_shardings(grads, state.params, frozen, mesh)
    grads = jax.tree.map(lambda s, h: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=h), grads, sh)
    if load is not None:
        load = jax.ShapeDtypeStruct(load.shape, load.dtype, sharding=_load_home(state.params, mesh))
    return grads, load


def _drop_lead(v, mesh):
    """The sharding of one micro-batch of a split field (None without a mesh)."""
    if mesh is None:
        return None
    return pmesh.batch_sharding(mesh, len(v.shape) - 1, batch_dim=0 if len(v.shape) == 3 else 1)
