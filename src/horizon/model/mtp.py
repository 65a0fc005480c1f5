"""Multi-token prediction (MTP) modules, DeepSeek-V3 style, trained by self-distillation (docs/SPEC.md §1.3).

Depth ``k = 1..K`` (``cfg.mtp_depth``) keeps the causal chain of DeepSeek-V3 §2.2::

    h^0 = main trunk hidden (before final_norm), aux["hidden"]
    h'^k_t = proj_k([enorm_k(Emb(x_{t+k})) ; hnorm_k(h^{k-1}_t)])      # [2D] -> [D]
    h^k    = Block_k(h'^k)                                             # one MLA + (MoE | dense) block
    logits^k_t = lm_head(head_norm_k(h^k_t))                           # lm_head shared with the main model

so position ``t`` of depth ``k`` predicts token ``x_{t+k+1}``. The concat order ``[embedding ; hidden]``
is the one of DeepSeek's released checkpoints (``eh_proj`` acts on ``cat(enorm(e), hnorm(h))``), so
``proj`` is ``eh_proj.weight.T``. Embedding and lm_head are shared with the main model; each depth has its
own output norm ``head_norm`` (DeepSeek-V3's ``shared_head.norm``).
Params are created by `transformer.init` (``params['mtp']``, see `transformer.mtp_spec`).

Validity: position t of depth k is valid iff ``t + k + 1 < s`` and token ``t+k+1`` is in the same segment
as token ``t`` (segments are contiguous, so no intermediate token crosses a boundary either). Invalid
positions read padding/other-segment tokens; they are masked out of the loss and, by causality, only
influence other invalid positions.

Self-distillation loss: ``KL(stop_grad(p_main(. | t+k)) || p_mtp^k(. | t))`` where the main head at
position ``t+k`` predicts the same token ``x_{t+k+1}``; averaged over valid positions per depth, then
over depths. ``freeze_trunk=True`` (on `mtp_logits`) stops gradients into the trunk: the hidden state
and the shared embedding / lm_head are detached, so only ``params["mtp"]`` learns.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from horizon.model import layers, transformer


def mtp_valid_mask(tokens: Int[Array, "b s"], depth: int, segment_ids: Int[Array, "b s"] | None = None
                   ) -> Bool[Array, "depth b s"]:
    """valid[k-1, b, t] = t+k+1 < s and segment(t+k+1) == segment(t)."""
    b, s = tokens.shape
    seg = jnp.zeros((b, s), jnp.int32) if segment_ids is None else segment_ids
    out = []
    for k in range(1, depth + 1):
        sh = k + 1
        in_range = jnp.arange(s) + sh < s
        seg_t = jnp.concatenate([seg[:, sh:], jnp.full((b, min(sh, s)), -1, seg.dtype)], axis=1)[:, :s]
        out.append(in_range[None, :] & (seg_t == seg))
    return jnp.stack(out)


def _shift_left(x: jax.Array, k: int, fill=0) -> jax.Array:
    """x[:, t+k] at position t, padded with `fill` past the end."""
    pad = jnp.full((x.shape[0], min(k, x.shape[1])) + x.shape[2:], fill, x.dtype)
    return jnp.concatenate([x[:, k:], pad], axis=1)[:, : x.shape[1]]


def mtp_logits(
    params: dict,
    hidden: Float[Array, "b s embed"],
    tokens: Int[Array, "b s"],
    *,
    cfg,
    positions: Int[Array, "b s"] | None = None,
    segment_ids: Int[Array, "b s"] | None = None,
    freeze_trunk: bool = False,
) -> tuple[Float[Array, "depth b s vocab"], Bool[Array, "depth b s"]]:
    """Logits of every MTP depth (float32) and the validity mask (see module docstring)."""
    c = transformer.model_cfg(cfg)
    if "mtp" not in params:
        raise ValueError("params have no 'mtp' modules (cfg.mtp_depth == 0?)")
    K = jax.tree.leaves(params["mtp"])[0].shape[0]
    if positions is None:
        positions = transformer.default_positions(tokens, segment_ids)
    seg = jnp.zeros(tokens.shape, jnp.int32) if segment_ids is None else segment_ids
    shared = {name: params[name] for name in ("embed", "lm_head") if name in params}
    if freeze_trunk:
        hidden = jax.lax.stop_gradient(hidden)
        shared = jax.lax.stop_gradient(shared)
    dt = layers.dtype_of(c.dtype)
    kind = transformer.block_kind(c)
    h = hidden.astype(dt)
    outs = []
    for k in range(1, K + 1):
        p = jax.tree.map(lambda a, k=k: a[k - 1], params["mtp"])
        e = layers.embed(shared["embed"], _shift_left(tokens, k), dt)
        z = jnp.concatenate([layers.rms_norm(p["enorm"], e, c.rms_norm_eps),
                             layers.rms_norm(p["hnorm"], h, c.rms_norm_eps)], axis=-1)
        h = z @ p["proj"].astype(dt)
        h, _ = transformer.block(p["block"], h, positions, seg, cfg=c, kind=kind)
        outs.append(transformer.lm_logits({**shared, "final_norm": p["head_norm"]}, h, cfg=c))
    return jnp.stack(outs), mtp_valid_mask(tokens, K, segment_ids)


def mtp_loss(
    main_logits: Float[Array, "b s vocab"],
    mtp_logits: Float[Array, "depth b s vocab"],
    mask: Bool[Array, "depth b s"],
) -> tuple[Float[Array, ""], Float[Array, " depth"]]:
    """Self-distillation KL (stop-gradient target = main head at position t+k). Returns (loss, per-depth).

    `mask` is `mtp_logits`' validity mask, optionally AND-ed with a loss mask by the caller.
    """
    K = mtp_logits.shape[0]
    per_depth = []
    for k in range(1, K + 1):
        target = jax.lax.stop_gradient(_shift_left(main_logits.astype(jnp.float32), k))
        logp = jax.nn.log_softmax(target, axis=-1)
        logq = jax.nn.log_softmax(mtp_logits[k - 1].astype(jnp.float32), axis=-1)
        kl = jnp.sum(jnp.exp(logp) * (logp - logq), axis=-1)
        m = mask[k - 1].astype(jnp.float32)
        per_depth.append(jnp.sum(kl * m) / jnp.maximum(m.sum(), 1.0))
    per_depth = jnp.stack(per_depth)
    return per_depth.mean(), per_depth
