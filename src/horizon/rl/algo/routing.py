"""Router replay's routing arithmetic for the RL trainer (docs/SPEC.md §4.1).

The sampler records the experts that processed each generated token; the trainer replays them
(`moe.route`'s ``replay_indices``). Tokens with no record (prompt, observations, padding: -1) take
the trainer router's own choice (`fill_replay`). `disagreement` measures how often the trainer's
routing and the sampler's differ: the mismatch router replay exists to remove, which a sampler
with its own numerics (`rl.sampler.compute_dtype`, `rl.sampler.router_noise`) creates.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from horizon.model import transformer


def own_routing(params, tokens: Int[Array, "r s"], *, cfg) -> Int[Array, "l t k"]:
    """The router's own top-k experts of every token [L_moe, rows*seq, k]: the trunk without replay,
    no gradient (routing needs no head)."""
    _, aux = transformer.hidden_states(jax.lax.stop_gradient(params), tokens, cfg=cfg.model)
    return aux["router_indices"]


def fill_replay(params, tokens: Int[Array, "r s"], replay, *, cfg, own=None):
    """Replace -1 entries (tokens with no recorded experts) by the router's own top-k choice (`own`,
    default `own_routing`)."""
    if replay is None or replay.shape[0] == 0:
        return replay
    has = jnp.all(replay >= 0, axis=-1, keepdims=True)
    own = own_routing(params, tokens, cfg=cfg) if own is None else own
    return jnp.where(has, replay, own).astype(jnp.int32)


def replay_for(params, tokens: Int[Array, "r s"], recorded, *, cfg):
    """(the indices the trainer's forward replays, the router's own routing) under `rl.router_replay`:
    (None, None) without replay or MoE layers' records to replay; else the recorded experts filled by
    `own_routing` (one extra trunk forward, also returned)."""
    if not bool(cfg.rl.router_replay):
        return None, None
    if recorded.shape[0] == 0:
        return recorded, None
    own = own_routing(params, tokens, cfg=cfg)
    return fill_replay(params, tokens, recorded, cfg=cfg, own=own), own


def differs(routing: Int[Array, "l t k"], recorded: Int[Array, "l t k"]) -> Bool[Array, "l t"]:
    """Whether a layer's expert set for a token differs between `routing` and `recorded` (order-free)."""
    return jnp.any(jnp.sort(routing, axis=-1) != jnp.sort(recorded, axis=-1), axis=-1)


def disagreement(routing: Int[Array, "l t k"], recorded: Int[Array, "l t k"],
                 loss_mask: Bool[Array, "r s"]) -> Float[Array, ""]:
    """Share of MoE layers whose expert set in `routing` differs from the sampler's `recorded` one,
    averaged over the loss tokens that have a record."""
    d = differs(routing, recorded).astype(jnp.float32).mean(axis=0)
    w = loss_mask.reshape(-1).astype(jnp.float32) * jnp.all(recorded >= 0, axis=(0, 2)).astype(jnp.float32)
    return jnp.sum(d * w) / jnp.maximum(w.sum(), 1.0)
