"""Multi-head Latent Attention (MLA) exactly as DeepSeek-V3 (docs/SPEC.md §1).

Notation: ``D`` model dim, ``H`` heads, ``n/r/v`` = qk_nope / qk_rope / v head dims, ``Rq``/``Rkv``
q / kv latent ranks.

Queries (low-rank path, ``q_lora_rank > 0``)::

    q = wq_b(RMSNorm_q(x @ wq_a))                    # [H, n + r], per head [nope | rope]
    (q_lora_rank == 0: q = x @ wq)

Keys / values share one latent per token plus one decoupled rope key shared by all heads::

    [c, k_r] = x @ wkv_a;  c = RMSNorm_kv(c)          # c: [Rkv], k_r: [r]
    [k_nope_h | v_h] = c @ wkv_b[:, h]                # per head [nope | v]
    score_h(t, s) = scale * (q_nope_h(t) . k_nope_h(s) + RoPE(q_rope_h(t)) . RoPE(k_r(s)))
    out = concat_h(softmax(score_h) @ v_h) @ wo

``scale = (n + r)^-0.5`` times the YaRN ``mscale^2`` (see `horizon.model.rope.softmax_scale`).

Training path (`attention`): full sequence, causal within a row, and tokens attend only to keys with
the same ``segment_id`` (packed sequences); RoPE uses the per-token ``positions`` (reset per segment by
the data pipeline).

Decode path (`attention_decode`): the cache holds only ``c`` (after kv_norm) and ``RoPE(k_r)``, per
layer. The key/value up-projections are absorbed (DeepSeek-V2 §2.1.2)::

    q_nope_h . (c W_uk_h) = (q_nope_h W_uk_h^T) . c           # query moved into latent space
    softmax(.) @ (c W_uv_h) = (softmax(.) @ c) W_uv_h         # output projected after the sum

so no per-head K/V is ever materialised. New tokens are written at cache slot = position (after
the attention, by `write_cache`), and a query at position p sees slots ``<= p``. Chunks (t > 1 tokens
per call) therefore work for prefill.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from horizon.model import blockwise, layers, rope

NEG_INF = -1e30  # finite mask value (a fully masked row stays finite; cannot happen with causal masks)

# Alternative training-path attention implementations, selected by ``cfg.attention_impl`` (default
# "local" = `attention` below). `horizon.parallel.context` registers "context_parallel" (docs/SPEC.md §2).
ATTENTION_IMPLS: dict = {}


def register_attention_impl(name: str, fn) -> None:
    """Register ``fn(p, x, positions, segment_ids, *, cfg)`` as ``cfg.attention_impl = name``."""
    ATTENTION_IMPLS[name] = fn


def attn_spec(cfg) -> dict:
    """`ParamSpec` tree of one MLA layer (layout fixed in docs/ARCHITECTURE.md)."""
    D, H = cfg.d_model, cfg.num_heads
    n, r, v = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    std, dt = cfg.init_std, layers.dtype_of(cfg.param_dtype)
    p = {}
    if cfg.q_lora_rank > 0:
        p["wq_a"] = layers.normal((D, cfg.q_lora_rank), std, dt)
        p["q_norm"] = layers.ones((cfg.q_lora_rank,), dt)
        p["wq_b"] = layers.normal((cfg.q_lora_rank, H * (n + r)), std, dt)
    else:
        p["wq"] = layers.normal((D, H * (n + r)), std, dt)
    p["wkv_a"] = layers.normal((D, cfg.kv_lora_rank + r), std, dt)
    p["kv_norm"] = layers.ones((cfg.kv_lora_rank,), dt)
    p["wkv_b"] = layers.normal((cfg.kv_lora_rank, H * (n + v)), std, dt)
    p["wo"] = layers.normal((H * v, D), std, dt)
    return p


def attn_logical_axes(cfg) -> dict:
    """Logical axis names of `attn_spec`'s arrays (without the stacked "layers" axis)."""
    if cfg.q_lora_rank > 0:
        q = {"wq_a": ("embed", "q_lora"), "q_norm": ("q_lora",), "wq_b": ("q_lora", "heads")}
    else:
        q = {"wq": ("embed", "heads")}
    return {
        **q,
        "wkv_a": ("embed", "kv_lora"),
        "kv_norm": ("kv_lora",),
        "wkv_b": ("kv_lora", "heads"),
        "wo": ("heads", "embed"),
    }


def queries(p: dict, x: jax.Array, positions: jax.Array, cfg, tables) -> tuple[jax.Array, jax.Array]:
    """q_nope [b,s,H,n] and RoPE'd q_rope [b,s,H,r] of hidden states x [b,s,D]."""
    dt = x.dtype
    if "wq" in p:
        q = x @ p["wq"].astype(dt)
    else:
        q = layers.rms_norm(p["q_norm"], x @ p["wq_a"].astype(dt), cfg.rms_norm_eps) @ p["wq_b"].astype(dt)
    b, s = x.shape[:2]
    q = q.reshape(b, s, cfg.num_heads, cfg.qk_nope_head_dim + cfg.qk_rope_head_dim)
    return q[..., : cfg.qk_nope_head_dim], rope.apply_rope(q[..., cfg.qk_nope_head_dim :], positions, tables)


def kv_latent(p: dict, x: jax.Array, positions: jax.Array, cfg, tables) -> tuple[jax.Array, jax.Array]:
    """c_kv [b,s,Rkv] (after kv_norm) and RoPE'd shared key k_rope [b,s,r]: what the KV cache holds."""
    ckr = x @ p["wkv_a"].astype(x.dtype)
    c = layers.rms_norm(p["kv_norm"], ckr[..., : cfg.kv_lora_rank], cfg.rms_norm_eps)
    k_rope = rope.apply_rope(ckr[..., cfg.kv_lora_rank :], positions, tables)
    return c, k_rope


def core_attention(
    p: dict,
    q_nope: Float[Array, "batch q heads nope"],
    q_rope: Float[Array, "batch q heads rope"],
    c: Float[Array, "batch kv latent"],
    k_rope: Float[Array, "batch kv rope"],
    q_index: Int[Array, "batch q"],
    kv_index: Int[Array, "batch kv"],
    q_seg: Int[Array, "batch q"],
    kv_seg: Int[Array, "batch kv"],
    *,
    cfg,
) -> Float[Array, "batch q embed"]:
    """MLA's core: queries over latent keys/values, query i seeing key j iff ``kv_index[j] <=
    q_index[i]`` and the segments match: per-head up-projection of the latent (`wkv_b`, once per
    key), the shared rope key broadcast over heads, `horizon.model.blockwise` attention (memory
    linear in the sequence; ``model.attention_kernel = "dense"`` runs the materialised reference),
    output projection. The local path (`attention`), the context-parallel one
    (`horizon.parallel.context`, over an all-gathered latent) and the engine's prefill chunks over
    the cache (`attention_decode`) all call it."""
    H, n, v = cfg.num_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
    dt = q_nope.dtype
    b, t = q_nope.shape[:2]
    s = c.shape[1]
    kv = jnp.swapaxes((c @ p["wkv_b"].astype(dt)).reshape(b, s, H, n + v), 1, 2)   # [b, H, s, n + v]
    k_rope_h = jnp.broadcast_to(k_rope.astype(dt)[:, None], (b, H, s, k_rope.shape[-1]))
    # Heads-major operands, so every product is a plain batched GEMM over (b, H) (docs/PERF.md
    # "Decode step, prefill and the old-path baseline").
    q = jnp.swapaxes(jnp.concatenate([q_nope, q_rope], axis=-1), 1, 2)              # [b, H, t, n + r]
    k = jnp.concatenate([kv[..., :n], k_rope_h], axis=-1)                            # [b, H, s, n + r]
    args = (q, k, kv[..., n:], q_index, kv_index, q_seg, kv_seg)
    scale = rope.softmax_scale(cfg)
    if cfg.get("attention_kernel", "blockwise") == "dense":
        out = blockwise.reference_attention(*args, scale=scale)
    else:
        out = blockwise.attention(*args, scale=scale, block_q=int(cfg.get("attention_block_q", 256)),
                                  block_kv=int(cfg.get("attention_block_kv", 256)))
    return jnp.swapaxes(out, 1, 2).reshape(b, t, H * v) @ p["wo"].astype(dt)


def attention(
    p: dict,
    x: Float[Array, "batch seq embed"],
    positions: Int[Array, "batch seq"],
    segment_ids: Int[Array, "batch seq"],
    *,
    cfg,
) -> Float[Array, "batch seq embed"]:
    """Training-path MLA over a full (packed) sequence: causal and segment-isolated."""
    impl = cfg.get("attention_impl", "local")
    if impl != "local":
        if impl not in ATTENTION_IMPLS:
            raise ValueError(f"attention_impl {impl!r} is not registered (known: {['local', *ATTENTION_IMPLS]}); "
                             "import horizon.parallel to register the parallel implementations")
        return ATTENTION_IMPLS[impl](p, x, positions, segment_ids, cfg=cfg)
    tables = rope.rope_tables(cfg)
    s = x.shape[1]
    q_nope, q_rope = queries(p, x, positions, cfg, tables)
    c, k_rope = kv_latent(p, x, positions, cfg, tables)
    idx = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), segment_ids.shape)
    return core_attention(p, q_nope, q_rope, c, k_rope, idx, idx, segment_ids, segment_ids, cfg=cfg)


def init_attn_cache(cfg, batch: int, max_len: int, dtype) -> dict:
    """Empty per-layer decode cache: latent ``c_kv`` [b, max_len, Rkv] and ``k_rope`` [b, max_len, r]."""
    return {
        "c_kv": jnp.zeros((batch, max_len, cfg.kv_lora_rank), dtype),
        "k_rope": jnp.zeros((batch, max_len, cfg.qk_rope_head_dim), dtype),
    }


def attention_decode(
    p: dict,
    x: Float[Array, "batch t embed"],
    positions: Int[Array, "batch t"],
    cache: dict,
    *,
    cfg,
) -> tuple[Float[Array, "batch t embed"], dict]:
    """Decode-path MLA over `cache` (not updated) and the t new tokens.

    Returns (output, this call's latents ``{"c_kv": [b, t, Rkv], "k_rope": [b, t, r]}``); the caller
    writes them at slots = positions (`write_cache`), once for every layer after the layer scan: a
    scan that returned each layer's updated cache copied every cache each decode step (docs/PERF.md
    "Decode step and rollout engine"). Attention is what it would be after the write: a query at
    position p sees slots ``<= p``, the new latents (rounded to the cache dtype, as a read back would
    be) at their positions (>= max_len: dropped, as by the write).

    - One token per row (decode, memory-bound): absorbed projections (W_uk into the query, W_uv after
      the value sum, DeepSeek-V2 §2.1.3) over the cache's slots ``< p`` plus the token itself, no
      copy of the cache.
    - A chunk (t > 1, prefill, compute-bound): the new latents scattered into a copy of this layer's
      cache, attended like the training path (`core_attention`: keys and values up-projected once per
      slot; query = the token's position, key = the slot, so slot blocks past the chunk's last
      position are skipped by the blockwise kernel). Multiply-adds per row and layer over s slots:
      absorbed t*H*(n*R + s*(2R + r) + R*v), unabsorbed s*R*H*(n + v) + t*s*H*(n + r + v), i.e.
      1.44M vs 0.92M on configs/tiny.py at t = s = 64 (analytic); the prefill timing is in
      docs/PERF.md "Decode step, prefill and the old-path baseline".
    """
    tables = rope.rope_tables(cfg)
    H, n, v, R = cfg.num_heads, cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    dt = x.dtype
    b, t, _ = x.shape
    max_len = cache["c_kv"].shape[1]
    q_nope, q_rope = queries(p, x, positions, cfg, tables)
    c_new, k_new = kv_latent(p, x, positions, cfg, tables)
    new = {"c_kv": c_new.astype(cache["c_kv"].dtype), "k_rope": k_new.astype(cache["k_rope"].dtype)}
    slots = jnp.arange(max_len)
    if t > 1:
        full = write_cache(cache, positions, new)
        kv_index = jnp.broadcast_to(slots.astype(jnp.int32), (b, max_len))
        zeros_q, zeros_kv = jnp.zeros((b, t), jnp.int32), jnp.zeros((b, max_len), jnp.int32)
        return core_attention(p, q_nope, q_rope, full["c_kv"].astype(dt), full["k_rope"].astype(dt), positions,
                              kv_index, zeros_q, zeros_kv, cfg=cfg), new
    wkv_b = p["wkv_b"].astype(dt).reshape(R, H, n + v)
    w_uk, w_uv = wkv_b[..., :n], wkv_b[..., n:]
    q_lat = jnp.einsum("bthn,chn->bthc", q_nope, w_uk)  # absorb W_uk into the query
    keys = [(cache["c_kv"].astype(dt), cache["k_rope"].astype(dt), slots[None, None, :] < positions[:, :, None]),
            (new["c_kv"].astype(dt), new["k_rope"].astype(dt), positions[:, :, None] < max_len)]
    sc = jnp.concatenate([jnp.einsum("bthc,bsc->bhts", q_lat, c_lat) + jnp.einsum("bthr,bsr->bhts", q_rope, k_r)
                          for c_lat, k_r, _ in keys], axis=-1)
    mask = jnp.concatenate([ok for _, _, ok in keys], axis=-1)[:, None]     # [b, 1, 1, keys]
    sc = jnp.where(mask, (sc * rope.softmax_scale(cfg)).astype(jnp.float32), NEG_INF)
    probs = jax.nn.softmax(sc, axis=-1).astype(dt)
    # probs as the left operand, contracting its minor dim against the cache's row dim: the
    # orientation XLA:CPU runs as one fused batched GEMM; the einsum order ("bhts,bsc->bthc") put
    # the cache first with a non-minor contraction and ran ~4x slower (benchmarks/rollout_engine.py).
    o_lat, off = 0.0, 0
    for c_lat, _, _ in keys:
        pr = probs[..., off:off + c_lat.shape[1]]
        o_lat = o_lat + jax.lax.dot_general(pr, c_lat, (((3,), (1,)), ((0,), (0,))))   # [b,h,t,c]
        off += c_lat.shape[1]
    out = jnp.einsum("bthc,chv->bthv", jnp.moveaxis(o_lat, 1, 2), w_uv).reshape(b, t, H * v)  # W_uv after the sum
    return out @ p["wo"].astype(dt), new


def write_cache(cache: dict, positions: Int[Array, "batch t"], new: dict) -> dict:
    """`new` latents ([..., b, t, dim], e.g. a stack of layers) written into `cache` ([..., b, max_len,
    dim]) at slots = positions; positions >= max_len are dropped. One scatter per array, in place
    when the cache buffer is donated or a loop carry."""
    lead = cache["c_kv"].ndim - 3

    def write(buf, upd):
        def one(bb, pos, u):
            return bb.at[pos].set(u.astype(bb.dtype), mode="drop")

        f = jax.vmap(one)
        for _ in range(lead):
            f = jax.vmap(f, in_axes=(0, None, 0))
        return f(buf, positions, upd)

    return {k: write(cache[k], new[k]) for k in cache}
