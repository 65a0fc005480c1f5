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
over depths, computed over token chunks by `horizon.model.head.token_kl` (no [depth, b, s, vocab]
logits). ``freeze_trunk=True`` (on `mtp_hidden` and `mtp_loss`) stops gradients into the trunk: the
hidden state and the shared embedding / lm_head are detached, so only ``params["mtp"]`` learns.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from horizon.model import head, layers, transformer
from horizon.model import loss as lm_loss


def mtp_valid_mask(tokens: Int[Array, "b s"], depth: int, segment_ids: Int[Array, "b s"] | None = None,
                   *, shift=lm_loss.shift_left) -> Bool[Array, "depth b s"]:
    """valid[k-1, b, t] = t+k+1 < s and segment(t+k+1) == segment(t) (`shift`: natural order, or the
    context-parallel layout's `horizon.parallel.context.zigzag_shift_left`)."""
    seg = jnp.zeros(tokens.shape, jnp.int32) if segment_ids is None else segment_ids
    return jnp.stack([shift(seg, k + 1, fill=-1) == seg for k in range(1, depth + 1)])


def mtp_hidden(
    params: dict,
    hidden: Float[Array, "b s embed"],
    tokens: Int[Array, "b s"],
    *,
    cfg,
    positions: Int[Array, "b s"] | None = None,
    segment_ids: Int[Array, "b s"] | None = None,
    freeze_trunk: bool = False,
    shift=lm_loss.shift_left,
) -> tuple[Float[Array, "depth b s embed"], Bool[Array, "depth b s"]]:
    """Every MTP depth's hidden state ``h^k`` (before its ``head_norm``) and the validity mask
    (module docstring); `mtp_loss` applies the shared head to them in chunks."""
    c = transformer.model_cfg(cfg)
    if "mtp" not in params:
        raise ValueError("params have no 'mtp' modules (cfg.mtp_depth == 0?)")
    K = jax.tree.leaves(params["mtp"])[0].shape[0]
    if positions is None:
        positions = transformer.default_positions(tokens, segment_ids)
    seg = jnp.zeros(tokens.shape, jnp.int32) if segment_ids is None else segment_ids
    embed = jax.lax.stop_gradient(params["embed"]) if freeze_trunk else params["embed"]
    dt = layers.dtype_of(c.dtype)
    kind = transformer.block_kind(c)
    h = (jax.lax.stop_gradient(hidden) if freeze_trunk else hidden).astype(dt)
    outs = []
    for k in range(1, K + 1):
        p = jax.tree.map(lambda a, k=k: a[k - 1], params["mtp"])
        e = layers.embed(embed, shift(tokens, k, fill=0), dt)
        z = jnp.concatenate([layers.rms_norm(p["enorm"], e, c.rms_norm_eps),
                             layers.rms_norm(p["hnorm"], h, c.rms_norm_eps)], axis=-1)
        h = z @ p["proj"].astype(dt)
        h, _ = transformer.block(p["block"], h, positions, seg, cfg=c, kind=kind)
        outs.append(h)
    return jnp.stack(outs), mtp_valid_mask(tokens, K, segment_ids, shift=shift)


def mtp_loss(
    params: dict,
    hidden: Float[Array, "b s embed"],
    mtp_h: Float[Array, "depth b s embed"],
    mask: Bool[Array, "depth b s"],
    *,
    cfg,
    freeze_trunk: bool = False,
    shift=lm_loss.shift_left,
) -> tuple[Float[Array, ""], Float[Array, " depth"]]:
    """Self-distillation KL (stop-gradient target = the main head at position t+k on the main
    `hidden`; student = the shared head after depth k's ``head_norm`` on `mtp_h`, `mtp_hidden`'s).
    Returns (loss, per-depth). Chunked by ``model.head_chunk`` (`head.token_kl`): neither the main
    nor the MTP logits exist whole. With `freeze_trunk` the shared head gets no gradient.

    `mask` is `mtp_hidden`'s validity mask, optionally AND-ed with a loss mask by the caller.
    """
    main = head.head_params(params)
    shared = {k: v for k, v in main.items() if k != "final_norm"}
    if freeze_trunk:
        shared = jax.lax.stop_gradient(shared)
    per_depth = []
    for k in range(1, mtp_h.shape[0] + 1):
        student = {**shared, "final_norm": params["mtp"]["head_norm"][k - 1]}
        kl = head.token_kl(main, shift(hidden, k, fill=0), student, mtp_h[k - 1], cfg=cfg)
        m = mask[k - 1].astype(jnp.float32)
        per_depth.append(jnp.sum(kl * m) / jnp.maximum(m.sum(), 1.0))
    per_depth = jnp.stack(per_depth)
    return per_depth.mean(), per_depth
