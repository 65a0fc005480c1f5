"""AdamW with warmup + cosine decay, global-norm clipping and parameter masks (docs/SPEC.md §8).

Two masks over the param tree:
- the **trainable** mask: leaves the optimizer may touch. `router_bias` is selection-only
  (aux-loss-free balancing updates it outside the optimizer, docs/SPEC.md §1), so it gets
  `optax.set_to_zero()` and no Adam state; with `mtp_freeze_trunk` only `mtp/` trains.
- the **weight-decay** mask: no decay on norm gains and biases.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import optax

from horizon.utils.config import need, need_float, need_int

NO_DECAY_SUFFIXES = ("norm", "bias")   # attn_norm, q_norm, kv_norm, final_norm, enorm, router_bias, ...


def _path_names(path) -> tuple[str, ...]:
    out = []
    for k in path:
        out.append(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))))
    return tuple(out)


def path_str(path) -> str:
    return "/".join(_path_names(path))


def decay_mask(params: Any) -> Any:
    """True where weight decay applies: every leaf except norms and biases (by leaf name,
    since stacked-layer norms are 2-D and cannot be told apart by rank)."""
    return jax.tree_util.tree_map_with_path(
        lambda p, _: not _path_names(p)[-1].endswith(NO_DECAY_SUFFIXES), params)


def default_trainable_mask(params: Any) -> Any:
    """Fallback when the model gives no mask: everything except `router_bias` leaves."""
    return jax.tree_util.tree_map_with_path(lambda p, _: _path_names(p)[-1] != "router_bias", params)


def validate_optim_config(o, prefix: str, steps: int, steps_field: str) -> None:
    """An optimizer section (the fields `make_optimizer` and `lr_schedule` read) whose schedule spans
    `steps` (the field named `steps_field`): `ConfigError` naming the field, before any work."""
    need_float(o, "lr", prefix, 0.0, lo_open=True)
    w = need_int(o, "warmup_steps", prefix, lo=0)
    need(w < steps, f"{prefix}.warmup_steps", w, f"must be < {steps_field}={steps}")
    need_float(o, "min_lr_ratio", prefix, 0.0, 1.0)
    need_float(o, "weight_decay", prefix, 0.0)
    need_float(o, "b1", prefix, 0.0, 1.0)
    need_float(o, "b2", prefix, 0.0, 1.0)
    need_float(o, "eps", prefix, 0.0, lo_open=True)
    need_float(o, "grad_clip", prefix, 0.0, lo_open=True)


def lr_schedule(tcfg: ml_collections.ConfigDict) -> optax.Schedule:
    """Linear warmup to `lr` over `warmup_steps`, cosine decay to `lr * min_lr_ratio` at `steps`."""
    if tcfg.steps <= 0 or tcfg.warmup_steps < 0 or tcfg.warmup_steps >= tcfg.steps:
        raise ValueError(f"need 0 <= warmup_steps < steps, got {tcfg.warmup_steps}, {tcfg.steps}")
    if not 0.0 <= tcfg.min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {tcfg.min_lr_ratio}")
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=tcfg.lr, warmup_steps=tcfg.warmup_steps,
        decay_steps=tcfg.steps, end_value=tcfg.lr * tcfg.min_lr_ratio)


def make_optimizer(
    tcfg: ml_collections.ConfigDict, trainable: Any, *, schedule: Callable | None = None,
) -> optax.GradientTransformation:
    """clip(global norm of trainable grads) -> AdamW(decay mask) on trainable leaves;
    frozen leaves (`trainable == False`) get zero updates and no optimizer state."""
    if tcfg.grad_clip <= 0:
        raise ValueError(f"grad_clip must be > 0, got {tcfg.grad_clip}")
    schedule = schedule or lr_schedule(tcfg)
    adamw = optax.chain(
        optax.clip_by_global_norm(tcfg.grad_clip),
        optax.adamw(schedule, b1=tcfg.b1, b2=tcfg.b2, eps=tcfg.eps,
                    weight_decay=tcfg.weight_decay, mask=decay_mask),
    )
    labels = jax.tree_util.tree_map(lambda t: "train" if t else "frozen", trainable)
    return optax.multi_transform({"train": adamw, "frozen": optax.set_to_zero()}, labels)
