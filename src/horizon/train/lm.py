"""Language-model training state and the pure, jittable train / eval steps (docs/SPEC.md §8).

One step: trunk over packed rows -> next-token CE on masked, same-segment targets (the LM head
over token chunks, `horizon.model.head`)
(+ optional MTP self-distillation, `cfg.model.mtp_depth > 0`) -> grads -> AdamW on the
trainable leaves -> aux-loss-free router-bias update from this batch's router load
(after the optimizer step, DeepSeek-V3 §2.1.2). Given the same state and batch the
step is bitwise deterministic, which is what makes exact resume possible.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float, Int

from horizon.data.tokenizer import validate_tokenizer
from horizon.model import head, moe, mtp, transformer
from horizon.model import loss as lm_loss
from horizon.parallel import context, sharded
from horizon.parallel import mesh as pmesh
from horizon.train import optim
from horizon.utils.config import need, need_float, need_int

Batch = dict[str, Array]  # tokens, segment_ids, positions, mask: [batch, seq]
LossFn = Callable[[Any, Batch], tuple[Array, dict]]   # (params, batch) -> (objective, aux)


class TrainState(NamedTuple):
    """Everything a step changes: a plain pytree (checkpointed as a whole)."""

    step: Int[Array, ""]
    params: Any
    opt_state: Any
    rng: Array  # raw uint32[2] key (jax.random.PRNGKey), split once per step


def validate_train_config(c: ml_collections.ConfigDict) -> None:
    """experiments/pretrain.py's and quant_ablation.py's config (configs/tiny.py): model, data and
    `train` fields checked before any directory or compile exists; `ConfigError` names the field."""
    transformer.validate_config(c.model)
    pmesh.validate_mesh(c)
    d, t = c.data, c.train
    need_int(d, "seq_len", "data", lo=2)
    need(int(d.seq_len) <= int(c.model.max_seq_len), "data.seq_len", d.seq_len,
         f"must be <= model.max_seq_len={c.model.max_seq_len}")
    need_int(d, "batch_size", "data", lo=1)
    sizes = pmesh.mesh_sizes(c.mesh)
    nb, cp = math.prod(sizes[a] for a in pmesh.BATCH_AXES), sizes[pmesh.SEQ_AXIS]
    need(int(d.batch_size) % nb == 0, "data.batch_size", d.batch_size,
         f"must be divisible by the mesh's batch axes (data*fsdp*expert = {nb})")
    if cp > 1:
        need(int(d.seq_len) % (2 * cp) == 0, "data.seq_len", d.seq_len,
             f"must be divisible by 2*mesh.context = {2 * cp} (zigzag layout)")
        need(int(c.model.mtp_depth) == 0, "model.mtp_depth", c.model.mtp_depth,
             "must be 0 with mesh.context > 1 (MTP needs natural order)")
    need_float(d, "heldout_fraction", "data", 0.0, 1.0, lo_open=True)
    root = pathlib.Path(str(d.root) or ".")
    need(root.is_dir(), "data.root", d.root, "no such directory")
    for src in d.sources:
        need((root / src).exists(), "data.sources", src, f"no such file or directory under {root}")
    validate_tokenizer(c.model)
    optim.validate_optim_config(t, "train", need_int(t, "steps", "train", lo=1), "train.steps")
    for k in ("log_every", "eval_every", "eval_batches", "checkpoint_every", "max_checkpoints"):
        need_int(t, k, "train", lo=1)
    validate_save_steps(t)
    need(bool(str(t.output_dir)), "train.output_dir", t.output_dir, "must name a run directory")


def validate_save_steps(t: ml_collections.ConfigDict) -> None:
    """`train.save_steps` (optional): steps in [0, steps], all of which the run keeps: with the periodic and
    final checkpoints they must fit in `max_checkpoints` (the manager deletes the oldest beyond it)."""
    keep = tuple(t.get("save_steps", ()) or ())
    need(all(isinstance(k, int) and 0 <= k <= int(t.steps) for k in keep), "train.save_steps", keep,
         f"must be integer steps in [0, train.steps={t.steps}]")
    if keep:
        saved = set(keep) | set(range(int(t.checkpoint_every), int(t.steps) + 1, int(t.checkpoint_every))) | {
            int(t.steps)}
        need(len(saved) <= int(t.max_checkpoints), "train.max_checkpoints", t.max_checkpoints,
             f"must be >= the {len(saved)} steps the run saves (save_steps, every checkpoint_every, the last), "
             "or some of train.save_steps are deleted")


def trainable_mask(params: Any, cfg: ml_collections.ConfigDict) -> Any:
    """The model's mask (router_bias frozen); with `mtp_freeze_trunk` only `params["mtp"]` trains."""
    mask = transformer.trainable_mask(params)
    if cfg.train.mtp_freeze_trunk:
        if cfg.model.mtp_depth <= 0:
            raise ValueError("train.mtp_freeze_trunk=True needs model.mtp_depth > 0")
        mask = {k: (v if k == "mtp" else jax.tree_util.tree_map(lambda _: False, v)) for k, v in mask.items()}
    return mask


def optimizer(params: Any, cfg: ml_collections.ConfigDict) -> optax.GradientTransformation:
    return optim.make_optimizer(cfg.train, trainable_mask(params, cfg))


def _init_state(key: jax.Array, cfg: ml_collections.ConfigDict) -> TrainState:
    k_model, k_rng = jax.random.split(key)
    params = transformer.init(k_model, cfg.model)
    opt_state = optimizer(params, cfg).init(params)
    return TrainState(jnp.zeros((), jnp.int32), params, opt_state, k_rng)


def init_state(key: jax.Array, cfg: ml_collections.ConfigDict) -> TrainState:
    """Fresh state from `key` (model init, optimizer state, step 0); jitted (one compile
    instead of hundreds of eager dispatches), deterministic in `key`."""
    return jax.jit(partial(_init_state, cfg=cfg))(key)


def losses(params: Any, batch: Batch, *, cfg: ml_collections.ConfigDict,
           shift=lm_loss.shift_left) -> tuple[Float[Array, ""], dict]:
    """(objective, aux): objective = CE (+ mtp_loss_weight * MTP KL); aux has metrics and router_load.
    The head runs over token chunks (`horizon.model.head`): no [b, s, vocab] logits. `shift` is the
    next-position shift of the batch's layout (`mesh_losses` passes the zigzag one under CP)."""
    tokens, seg, pos = batch["tokens"], batch["segment_ids"], batch["positions"]
    mask = batch["mask"]
    hidden, aux = transformer.hidden_states(params, tokens, cfg=cfg.model, positions=pos, segment_ids=seg)
    tgt, tw = lm_loss.next_token_targets(tokens, mask, seg, shift=shift)
    ce, count = lm_loss.mean_nll(head.token_logprobs(params, hidden, tgt, cfg=cfg.model)[0], tw)
    out = {"loss": ce, "tokens": count, "router_load": aux["router_load"]}
    objective = ce
    if cfg.model.mtp_depth > 0:
        freeze = bool(cfg.train.mtp_freeze_trunk)
        m_hidden, valid = mtp.mtp_hidden(params, hidden, tokens, cfg=cfg.model, positions=pos,
                                         segment_ids=seg, freeze_trunk=freeze, shift=shift)
        # depth k at position t predicts token t+k+1: it must be a loss-bearing token too.
        target_ok = jnp.stack([shift(mask, k + 1, fill=0) > 0 for k in range(1, valid.shape[0] + 1)])
        m_loss, per_depth = mtp.mtp_loss(params, hidden, m_hidden, valid & target_ok, cfg=cfg.model,
                                         freeze_trunk=freeze, shift=shift)
        out["mtp_loss"] = m_loss
        out["mtp_loss_per_depth"] = per_depth
        w = cfg.train.mtp_loss_weight
        # A frozen trunk gets no update, so skip the main-loss backward entirely.
        objective = w * m_loss if freeze else ce + w * m_loss
    return objective, out


def train_step(state: TrainState, batch: Batch, *, cfg: ml_collections.ConfigDict,
               loss_fn: LossFn | None = None, with_grads: bool = False) -> tuple[TrainState, dict]:
    """One optimizer step (pure; jit it with `cfg` closed over, see `jit_train_step`). The one LM
    step of every mesh: `loss_fn(params, batch) -> (objective, aux)` defaults to `losses`; the
    mesh step passes the context-parallel one (`mesh_losses`). With
    `with_grads`, metrics also hold ``grads`` (equivalence tests)."""
    loss_fn = partial(losses, cfg=cfg) if loss_fn is None else loss_fn
    (objective, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
    trainable = trainable_mask(state.params, cfg)
    tx = optim.make_optimizer(cfg.train, trainable)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    load = aux["router_load"]
    if load.size and not cfg.train.mtp_freeze_trunk:  # a frozen trunk keeps its routing bias too
        params = moe.update_router_bias(params, load, cfg.model)
    grad_norm = optax.tree.norm(jax.tree_util.tree_leaves(
        jax.tree_util.tree_map(lambda g, t: g if t else jnp.zeros_like(g), grads, trainable)))
    metrics = {"loss": aux["loss"], "objective": objective, "grad_norm": grad_norm,
               "lr": optim.lr_schedule(cfg.train)(state.step), "tokens": aux["tokens"]}
    if "mtp_loss" in aux:
        metrics["mtp_loss"] = aux["mtp_loss"]
    if load.size:  # max/mean expert load, averaged over MoE layers (1 = perfectly balanced)
        metrics["router_imbalance"] = jnp.mean(load.max(-1) / jnp.maximum(load.mean(-1), 1e-9))
    if with_grads:
        metrics["grads"] = grads
    rng, _ = jax.random.split(state.rng)
    return TrainState(state.step + 1, params, opt_state, rng), metrics


def eval_step(params: Any, batch: Batch, *, cfg: ml_collections.ConfigDict, loss_fn: LossFn | None = None) -> dict:
    """Held-out metrics for one batch: mean CE and its target count (weight for averaging)."""
    _, aux = (partial(losses, cfg=cfg) if loss_fn is None else loss_fn)(params, batch)
    out = {"loss": aux["loss"], "tokens": aux["tokens"]}
    if "mtp_loss" in aux:
        out["mtp_loss"] = aux["mtp_loss"]
    return out


def jit_train_step(cfg: ml_collections.ConfigDict):
    """`train_step` jitted for one config (configs are not hashable, so close over it)."""
    return jax.jit(partial(train_step, cfg=cfg))


def jit_eval_step(cfg: ml_collections.ConfigDict):
    return jax.jit(partial(eval_step, cfg=cfg))


def evaluate(eval_fn, params: Any, batches: list[Batch]) -> dict[str, float]:
    """Token-weighted mean of `eval_fn` metrics over a fixed list of batches."""
    sums: dict[str, float] = {}
    count = 0.0
    for b in batches:
        m = jax.device_get(eval_fn(params, b))
        n = float(m["tokens"])
        for k, v in m.items():
            if k != "tokens":
                sums[k] = sums.get(k, 0.0) + float(v) * n
        count += n
    out = {f"eval_{k}": v / max(count, 1.0) for k, v in sums.items()}
    out["eval_tokens"] = count
    return out


def mesh_losses(params: Any, batch: Batch, *, cfg, mesh) -> tuple[jax.Array, dict]:
    """`losses` for a configured cfg (`sharded.configure`) (the `loss_fn` of `train_step` / `eval_step` on a
    mesh); with CP the batch is permuted to the zigzag layout and `losses` runs there with the layout's
    shift (`context.zigzag_shift_left`: next-token targets and MTP's shifts on true positions)."""
    cp = sharded.cp_size(cfg)
    if cp == 1:
        return losses(params, batch, cfg=cfg)
    S = batch["tokens"].shape[1]
    if S % (2 * cp):
        raise ValueError(f"seq_len {S} must be divisible by 2*context={2 * cp} for the zigzag layout")
    sh = NamedSharding(mesh, P(pmesh.BATCH_AXES, pmesh.SEQ_AXIS))
    zz = {k: jax.lax.with_sharding_constraint(context.zigzag_permute(batch[k], cp), sh)
          for k in ("tokens", "segment_ids", "positions", "mask")}
    return losses(params, zz, cfg=cfg, shift=partial(context.zigzag_shift_left, cp=cp))


def make_train_step(cfg, mesh, state_shapes: TrainState, *, with_grads: bool = False):
    """(step(state, batch) -> (state, metrics), state shardings, batch sharding) for one mesh.

    `cfg` is the unconfigured config (``cfg.mesh`` decides the paths); the step donates nothing."""
    c = sharded.configure(cfg)
    st_sh = sharded.state_shardings(state_shapes, state_shapes.params, c, mesh)
    b_sh = pmesh.batch_sharding(mesh)
    metrics_sh = None  # let XLA pick (scalars end up replicated)
    fn = jax.jit(partial(train_step, cfg=c, loss_fn=partial(mesh_losses, cfg=c, mesh=mesh), with_grads=with_grads),
                 in_shardings=(st_sh, b_sh), out_shardings=(st_sh, metrics_sh))
    return sharded.with_mesh(fn, mesh), st_sh, b_sh


def make_eval_step(cfg, mesh, params_shapes: Any):
    """Jitted sharded `eval_step(params, batch)` (same loss as `make_train_step`)."""
    c = sharded.configure(cfg)
    p_sh = pmesh.param_shardings(params_shapes, c, mesh)
    fn = jax.jit(partial(eval_step, cfg=c, loss_fn=partial(mesh_losses, cfg=c, mesh=mesh)),
                 in_shardings=(p_sh, pmesh.batch_sharding(mesh)))
    return sharded.with_mesh(fn, mesh)
