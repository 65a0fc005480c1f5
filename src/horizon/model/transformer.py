"""DeepSeek-V3 / Kimi-K2 style decoder: embeddings, MLA + (dense SwiGLU | MoE) blocks, LM head (docs/SPEC.md §1).

Each block (pre-norm residual)::

    h = x + MLA(RMSNorm(x));   x' = h + FFN(RMSNorm(h))      # FFN = SwiGLU (first_k_dense layers) or MoE

The first ``first_k_dense`` layers are dense, the rest MoE (all dense if ``num_experts == 0``). Both
groups are stacked along a leading layer axis and run with `jax.lax.scan`. `hidden_states` is the
trunk (the last hidden state *before* ``final_norm``: what MTP and the chunked head of
`horizon.model.head` consume); `forward` adds the head's float32 logits.

All functions take the model config (``cfg.model``; a full config with a ``model`` field is accepted).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from horizon.model import layers, mla, moe, rope
from horizon.quant import grouped
from horizon.utils.config import ConfigError


def model_cfg(cfg):
    """Accept a full config (with ``.model``) or the model sub-config."""
    return cfg.model if "model" in cfg else cfg


def validate_config(cfg) -> None:
    """Raise `ConfigError` (a ValueError) with a one-line message on inconsistent model configs."""
    c = model_cfg(cfg)

    def need(cond: bool, msg: str):
        if not cond:
            raise ConfigError(f"invalid model config: model.{msg}")

    for f in ("vocab_size", "d_model", "num_layers", "num_heads", "kv_lora_rank", "qk_nope_head_dim",
              "qk_rope_head_dim", "v_head_dim"):
        need(int(c[f]) > 0, f"{f} must be > 0 (got {c[f]})")
    need(c.q_lora_rank >= 0, f"q_lora_rank must be >= 0 (0 = full-rank q), got {c.q_lora_rank}")
    need(c.qk_rope_head_dim % 2 == 0, f"qk_rope_head_dim must be even, got {c.qk_rope_head_dim}")
    need(0 <= c.first_k_dense <= c.num_layers, f"first_k_dense={c.first_k_dense} not in [0, num_layers={c.num_layers}]")
    need(c.mlp_dim > 0 or (c.first_k_dense == 0 and c.num_experts > 0), "mlp_dim must be > 0 for dense layers")
    need(c.num_experts >= 0, f"num_experts must be >= 0, got {c.num_experts}")
    if c.num_experts > 0:
        E, k = c.num_experts, c.num_experts_per_tok
        need(c.moe_mlp_dim > 0, "moe_mlp_dim must be > 0")
        need(1 <= k <= E, f"num_experts_per_tok={k} must be in [1, num_experts={E}]")
        need(c.n_group >= 1 and E % c.n_group == 0, f"num_experts={E} must be divisible by n_group={c.n_group}")
        need(1 <= c.topk_group <= c.n_group, f"topk_group={c.topk_group} must be in [1, n_group={c.n_group}]")
        if c.n_group > 1 and c.topk_group < c.n_group:
            need(E // c.n_group >= 2,
                 f"n_group={c.n_group}: group-limited routing needs >= 2 experts per group (top-2 group score)")
            need(c.topk_group * (E // c.n_group) >= k,
                 f"topk_group*experts_per_group={c.topk_group * (E // c.n_group)} < num_experts_per_tok={k}")
        need(c.num_shared_experts >= 0, "num_shared_experts must be >= 0")
        need(c.replay_plausibility_ratio >= 0, "replay_plausibility_ratio must be >= 0")
        need(c.get("replay_plausibility_score", "gate") in moe.PLAUSIBILITY_SCORES,
             f"replay_plausibility_score={c.get('replay_plausibility_score')!r} is unknown "
             f"(one of {moe.PLAUSIBILITY_SCORES})")
        need(float(c.get("router_logit_noise", 0.0)) >= 0,
             f"router_logit_noise must be >= 0, got {c.get('router_logit_noise')}")
        need(c.moe_precision in moe.PRECISIONS_IMPLEMENTED + moe.PRECISIONS_PLANNED,
             f"moe_precision={c.moe_precision!r} is unknown "
             f"(one of {moe.PRECISIONS_IMPLEMENTED + moe.PRECISIONS_PLANNED})")
        need(c.get("grouped_impl", "auto") in grouped.IMPLS,
             f"grouped_impl={c.get('grouped_impl')!r} is unknown (one of {grouped.IMPLS})")
    need(c.mtp_depth >= 0, f"mtp_depth must be >= 0, got {c.mtp_depth}")
    hc = c.get("head_chunk", 0)
    need(isinstance(hc, int) and hc >= 0, f"head_chunk must be an int >= 0 (0 = full logits), got {hc!r}")
    need(c.rope_scaling.type in rope.ROPE_TYPES,
         f"rope_scaling.type={c.rope_scaling.type!r} must be in {rope.ROPE_TYPES}")
    if c.rope_scaling.type == "yarn":
        need(c.rope_scaling.factor >= 1, "rope_scaling.factor must be >= 1 for yarn")
        need(c.rope_scaling.original_max_position_embeddings > 0,
             "rope_scaling.original_max_position_embeddings must be > 0")
    for f in ("dtype", "param_dtype"):
        try:
            layers.dtype_of(c[f])
        except (KeyError, ValueError) as e:
            raise ConfigError(f"invalid model config: model.{f}={c[f]!r}: {e}") from None


def layer_counts(cfg) -> tuple[int, int]:
    """(dense layers, MoE layers) of the main stack."""
    c = model_cfg(cfg)
    if c.num_experts == 0:
        return c.num_layers, 0
    return c.first_k_dense, c.num_layers - c.first_k_dense


def block_kind(cfg) -> str:
    """Kind of the MTP block: "moe" if the model has experts, else "dense"."""
    return "moe" if model_cfg(cfg).num_experts > 0 else "dense"


# ----------------------------------------------------------------------------------------------- init


def layer_spec(cfg, kind: str) -> dict:
    """`ParamSpec` tree of one block ("dense" or "moe")."""
    c = model_cfg(cfg)
    dt = layers.dtype_of(c.param_dtype)
    p = {"attn_norm": layers.ones((c.d_model,), dt), "attn": mla.attn_spec(c),
         "mlp_norm": layers.ones((c.d_model,), dt)}
    if kind == "dense":
        p["mlp"] = layers.swiglu_spec(c.d_model, c.mlp_dim, std=c.init_std, dtype=dt)
    else:
        p["moe"] = moe.moe_spec(c)
    return p


def mtp_spec(cfg) -> dict:
    """`ParamSpec` tree of the MTP modules, stacked over depth: {enorm, hnorm, proj [2D, D], block, head_norm}.

    `head_norm` is the module's own output norm before the shared LM head (DeepSeek-V3's
    ``shared_head.norm``)."""
    c = model_cfg(cfg)
    dt = layers.dtype_of(c.param_dtype)
    one = {"enorm": layers.ones((c.d_model,), dt), "hnorm": layers.ones((c.d_model,), dt),
           "proj": layers.normal((2 * c.d_model, c.d_model), c.init_std, dt),
           "block": layer_spec(c, block_kind(c)), "head_norm": layers.ones((c.d_model,), dt)}
    return layers.stack_specs(one, c.mtp_depth)


def param_spec(cfg) -> dict:
    """`ParamSpec` tree of the whole model (shapes/dtypes/init rules; no arrays)."""
    c = model_cfg(cfg)
    validate_config(c)
    dt = layers.dtype_of(c.param_dtype)
    n_dense, n_moe = layer_counts(c)
    spec = {"embed": layers.normal((c.vocab_size, c.d_model), c.init_std, dt),
            "final_norm": layers.ones((c.d_model,), dt)}
    if not c.tie_embeddings:
        spec["lm_head"] = layers.normal((c.d_model, c.vocab_size), c.init_std, dt)
    if n_dense:
        spec["dense"] = layers.stack_specs(layer_spec(c, "dense"), n_dense)
    if n_moe:
        spec["moe"] = layers.stack_specs(layer_spec(c, "moe"), n_moe)
    if c.mtp_depth:
        spec["mtp"] = mtp_spec(c)
    return spec


def init(key: jax.Array, cfg) -> dict:
    """Initialise the full param tree (layout: docs/ARCHITECTURE.md). Deterministic in `key`.

    Matrices ~ N(0, init_std^2), norms 1, router bias 0 (see `layers.materialize`).
    """
    return layers.materialize(key, param_spec(cfg))


def layer_logical_axes(cfg, kind: str) -> dict:
    c = model_cfg(cfg)
    p = {"attn_norm": ("embed",), "attn": mla.attn_logical_axes(c), "mlp_norm": ("embed",)}
    if kind == "dense":
        p["mlp"] = {"gate": ("embed", "mlp"), "up": ("embed", "mlp"), "down": ("mlp", "embed")}
    else:
        p["moe"] = moe.moe_logical_axes(c)
    return p


def _stacked(tree: dict) -> dict:
    return jax.tree.map(lambda t: ("layers",) + t, tree, is_leaf=lambda t: isinstance(t, tuple))


def param_logical_axes(cfg) -> dict:
    """Pytree like `init`'s output with a tuple of logical axis names per array.

    Names: vocab, embed, layers (stacked layer axis, also MTP depth), q_lora, kv_lora, heads (head-major
    packed projection dims), mlp, expert, moe_mlp, router_expert (router's expert axis), mtp_in.
    """
    c = model_cfg(cfg)
    n_dense, n_moe = layer_counts(c)
    axes = {"embed": ("vocab", "embed"), "final_norm": ("embed",)}
    if not c.tie_embeddings:
        axes["lm_head"] = ("embed", "vocab")
    if n_dense:
        axes["dense"] = _stacked(layer_logical_axes(c, "dense"))
    if n_moe:
        axes["moe"] = _stacked(layer_logical_axes(c, "moe"))
    if c.mtp_depth:
        axes["mtp"] = _stacked({"enorm": ("embed",), "hnorm": ("embed",), "proj": ("mtp_in", "embed"),
                                "block": layer_logical_axes(c, block_kind(c)), "head_norm": ("embed",)})
    return axes


def trainable_mask(params: dict) -> dict:
    """Bool pytree: False for ``router_bias`` (updated by `moe.update_router_bias`, not the optimizer)."""
    def is_trainable(path, _):
        return not any(getattr(k, "key", None) == "router_bias" for k in path)

    return jax.tree_util.tree_map_with_path(is_trainable, params)


# -------------------------------------------------------------------------------------------- forward


def default_positions(tokens: jax.Array, segment_ids: jax.Array | None) -> jax.Array:
    """0..s-1 per row, restarting at every segment boundary when `segment_ids` is given."""
    b, s = tokens.shape
    idx = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    if segment_ids is None:
        return idx
    is_start = jnp.concatenate([jnp.ones((b, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
    start = jax.lax.cummax(jnp.where(is_start, idx, 0), axis=1)
    return idx - start


def block(p: dict, x, positions, segment_ids, *, cfg, kind: str, replay_indices=None):
    """One pre-norm block; returns (x, stats) where stats is None for dense blocks."""
    c = model_cfg(cfg)
    eps = c.rms_norm_eps
    h = x + mla.attention(p["attn"], layers.rms_norm(p["attn_norm"], x, eps), positions, segment_ids, cfg=c)
    hn = layers.rms_norm(p["mlp_norm"], h, eps)
    if kind == "dense":
        return h + layers.swiglu(p["mlp"], hn), None
    y, stats = moe.moe_block(p["moe"], hn, cfg=c, replay_indices=replay_indices)
    return h + y, stats


def block_decode(p: dict, x, positions, cache, *, cfg, kind: str, replay_indices=None):
    """One block of the decode path over its layer's cache (read only); returns (x, this call's
    latents for `mla.write_cache`, stats)."""
    c = model_cfg(cfg)
    eps = c.rms_norm_eps
    a, new = mla.attention_decode(p["attn"], layers.rms_norm(p["attn_norm"], x, eps), positions, cache, cfg=c)
    h = x + a
    hn = layers.rms_norm(p["mlp_norm"], h, eps)
    if kind == "dense":
        return h + layers.swiglu(p["mlp"], hn), new, None
    y, stats = moe.moe_block(p["moe"], hn, cfg=c, replay_indices=replay_indices)
    return h + y, new, stats


def lm_logits(params: dict, hidden: Float[Array, "*b embed"], *, cfg) -> Float[Array, "*b vocab"]:
    """final_norm + LM head (float32 logits); shared by the main model and MTP."""
    c = model_cfg(cfg)
    head = params["lm_head"] if "lm_head" in params else params["embed"].T
    return layers.unembed(layers.rms_norm(params["final_norm"], hidden, c.rms_norm_eps), head)


def _empty_stats(c, T: int) -> dict:
    return {"indices": jnp.zeros((0, T, c.num_experts_per_tok), jnp.int32),
            "load": jnp.zeros((0, max(c.num_experts, 0)), jnp.float32)}


def _check_replay(replay_indices, n_moe: int, T: int, c) -> None:
    if replay_indices is None:
        return
    want = (n_moe, T, c.num_experts_per_tok)
    if tuple(replay_indices.shape) != want:
        raise ValueError(f"replay_indices shape {tuple(replay_indices.shape)} != [L_moe, b*s, k] = {want}")


def _maybe_remat(step, c):
    """`step` (one scanned layer) under `jax.checkpoint` when `model.remat` is on: the backward
    pass recomputes the layer's activations from its input instead of keeping them (the per-head
    keys, values and MoE rows of every layer), ~one extra forward for a per-layer activation footprint."""
    return jax.checkpoint(step) if bool(c.get("remat", False)) else step


def hidden_states(
    params: dict,
    tokens: Int[Array, "batch seq"],
    *,
    cfg,
    positions: Int[Array, "batch seq"] | None = None,
    segment_ids: Int[Array, "batch seq"] | None = None,
    replay_indices: Int[Array, "moe_layers tokens k"] | None = None,
) -> tuple[Float[Array, "batch seq embed"], dict]:
    """The trunk of the training forward over (packed) sequences: the last hidden state before
    ``final_norm`` [b, s, D], and aux with ``router_indices`` int32 [L_moe, b*s, k] and ``router_load``
    float32 [L_moe, E]. The training losses apply the head to it in chunks (`horizon.model.head`).

    `positions` default to 0..s-1 restarting at each segment; `segment_ids` default to one segment
    per row. `replay_indices` overrides routing per MoE layer and token (rows containing -1 are not
    replayed; `horizon.model.moe`).
    """
    c = model_cfg(cfg)
    validate_config(c)
    b, s = tokens.shape
    n_dense, n_moe = layer_counts(c)
    _check_replay(replay_indices, n_moe, b * s, c)
    if positions is None:
        positions = default_positions(tokens, segment_ids)
    if segment_ids is None:
        segment_ids = jnp.zeros((b, s), jnp.int32)
    x = layers.embed(params["embed"], tokens, layers.dtype_of(c.dtype))

    if n_dense:
        def dense_step(x, p):
            return block(p, x, positions, segment_ids, cfg=c, kind="dense")[0], None

        x, _ = jax.lax.scan(_maybe_remat(dense_step, c), x, params["dense"])
    if n_moe:
        def moe_step(x, inp):
            p, rep = inp
            return block(p, x, positions, segment_ids, cfg=c, kind="moe", replay_indices=rep)

        x, stats = jax.lax.scan(_maybe_remat(moe_step, c), x, (params["moe"], replay_indices))
    else:
        stats = _empty_stats(c, b * s)
    return x, {"router_indices": stats["indices"], "router_load": stats["load"]}


def forward(
    params: dict,
    tokens: Int[Array, "batch seq"],
    *,
    cfg,
    positions: Int[Array, "batch seq"] | None = None,
    segment_ids: Int[Array, "batch seq"] | None = None,
    replay_indices: Int[Array, "moe_layers tokens k"] | None = None,
) -> tuple[Float[Array, "batch seq vocab"], dict]:
    """`hidden_states` + `lm_logits`: float32 logits [b, s, V] (sampling, eval, tests), and aux as
    `hidden_states`' plus ``hidden`` [b, s, D] (before final_norm)."""
    x, aux = hidden_states(params, tokens, cfg=cfg, positions=positions, segment_ids=segment_ids,
                           replay_indices=replay_indices)
    return lm_logits(params, x, cfg=cfg), {**aux, "hidden": x}


def init_cache(cfg, batch: int, max_len: int) -> dict:
    """Decode cache per layer group: ``c_kv`` [L, b, max_len, Rkv] and ``k_rope`` [L, b, max_len, r]."""
    c = model_cfg(cfg)
    validate_config(c)
    dt = layers.dtype_of(c.dtype)
    cache = {}
    for name, n in zip(("dense", "moe"), layer_counts(c)):
        if n:
            one = mla.init_attn_cache(c, batch, max_len, dt)
            cache[name] = jax.tree.map(lambda a, n=n: jnp.broadcast_to(a, (n,) + a.shape), one)
    return cache


def decode(
    params: dict,
    cache: dict,
    tokens: Int[Array, "batch t"],
    positions: Int[Array, "batch t"],
    *,
    cfg,
    replay_indices: Int[Array, "moe_layers tokens k"] | None = None,
    logits_at: Int[Array, " batch"] | None = None,
) -> tuple[Float[Array, "batch t vocab"], dict, dict]:
    """Incremental forward for t >= 1 new tokens per row at absolute `positions` (cache slots).

    Returns (float32 logits [b, t, V], updated cache, aux as in `forward` with T = b*t). Positions
    >= the cache's max_len are not written (dropped), so keep positions < max_len. With
    `logits_at` (one index into t per row) only those positions get logits, [b, 1, V]: a prefill
    needs just the last prompt token's, and the LM head over every prompt position would cost
    more than the rest of a small model's prefill (benchmarks/sampling.py).
    """
    c = model_cfg(cfg)
    validate_config(c)
    b, t = tokens.shape
    if positions.shape != (b, t):
        raise ValueError(f"positions shape {positions.shape} != tokens shape {(b, t)}")
    n_dense, n_moe = layer_counts(c)
    _check_replay(replay_indices, n_moe, b * t, c)
    x = layers.embed(params["embed"], tokens, layers.dtype_of(c.dtype))
    # The layer scans read the cache and return only the new tokens' latents; they are written after
    # (one scatter per stacked array): a scan whose ys were the updated caches copied every layer's
    # whole cache each step (docs/PERF.md "Decode step and rollout engine").
    new = {}
    if n_dense:
        def dense_step(x, inp):
            p, lc = inp
            x, nl, _ = block_decode(p, x, positions, lc, cfg=c, kind="dense")
            return x, nl

        x, new["dense"] = jax.lax.scan(dense_step, x, (params["dense"], cache["dense"]))
    if n_moe:
        def moe_step(x, inp):
            p, lc, rep = inp
            x, nl, st = block_decode(p, x, positions, lc, cfg=c, kind="moe", replay_indices=rep)
            return x, (nl, st)

        x, (new["moe"], stats) = jax.lax.scan(moe_step, x, (params["moe"], cache["moe"], replay_indices))
    else:
        stats = _empty_stats(c, b * t)
    new_cache = {k: mla.write_cache(cache[k], positions, new[k]) for k in new}
    head_in = x if logits_at is None else jnp.take_along_axis(x, logits_at[:, None, None], axis=1)
    logits = lm_logits(params, head_in, cfg=c)
    return logits, new_cache, {"router_indices": stats["indices"], "router_load": stats["load"], "hidden": x}
