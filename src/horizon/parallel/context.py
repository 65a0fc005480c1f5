"""Context parallelism for MLA with a load-balanced causal (zigzag) layout (docs/SPEC.md §2).

Layout: the sequence (length S) is cut into ``2*CP`` chunks; CP rank i holds chunks ``i`` and
``2*CP-1-i`` (`zigzag_permute` reorders a natural-order array so that a contiguous split over the
``context`` axis gives exactly that). Every rank then owns the same amount of causal work: one early
chunk (few keys) and one late chunk (many keys). The whole model runs in this layout (everything but
attention is per-token); the LM loss permutes its next-token targets the same way
(`horizon.parallel.sharded`), so nothing is ever un-permuted. ``cfg.model.cp_layout = "natural"``
instead permutes around every attention layer (two reshuffles per layer, same result): the mode for
callers whose loss shifts tokens in natural order and cannot be changed (the RL trainer).

Attention (`cp_attention`, selected by ``cfg.model.attention_impl = "context_parallel"``) runs inside
`jax.shard_map` over all mesh axes (batch over (data, fsdp, expert), sequence over context):

1. local KV latents: ``[c_kv | RoPE(k_rope)] = x_local @ wkv_a`` (+ kv_norm) — ``Rkv + r`` numbers per
   token, e.g. 512 + 64 for DeepSeek-V3 instead of ``H * (n + v)`` = 128 * 256 for full K/V;
2. ``all_gather`` of the LATENTS (+ segment ids) over ``context`` (the only collective);
3. the query projection (independent of the gather: the scheduler may overlap them);
4. the KV up-projection ``wkv_b`` applied locally to the gathered latents (replicated compute);
5. blockwise attention (`horizon.model.blockwise`) of the local queries over all S keys, visible iff
   ``key_index <= query_index`` on the TRUE (natural-order) sequence indices of the zigzag layout and
   ``same segment`` for packed rows; the rank's early chunk skips the key blocks after it.

What the compiled HLO shows (XLA:CPU, tests/parallel/test_context.py checks it): exactly one
all-gather per attention layer, whose operand is ``[b_local, S/CP, Rkv + r]`` (the latents), plus an
int32 all-gather of segment ids; no all-gather of a per-head K/V. XLA:CPU executes collectives
synchronously (no ``all-gather-start/done`` pairs), so there is no actual overlap on CPU; on GPU XLA
turns the gather into an async start/done pair and the latency-hiding scheduler can place the Q
projection between them since the two have no data dependency.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float, Int

from horizon.model import mla, rope
from horizon.parallel import mesh as pmesh

IMPL_NAME = "context_parallel"


def zigzag_indices(seq_len: int, cp: int) -> np.ndarray:
    """Natural-order index of every slot of the zigzag layout: ``x_zz = x[:, idx]``."""
    if cp < 1 or seq_len % (2 * cp):
        raise ValueError(f"seq_len={seq_len} must be divisible by 2*cp={2 * cp}")
    c = seq_len // (2 * cp)
    chunks = np.arange(seq_len).reshape(2 * cp, c)
    order = [j for i in range(cp) for j in (i, 2 * cp - 1 - i)]
    return chunks[order].reshape(-1)


def zigzag_permute(x: Array, cp: int, axis: int = 1) -> Array:
    """Natural order -> zigzag layout along `axis` (identity for cp == 1)."""
    if cp == 1:
        return x
    return jnp.take(x, jnp.asarray(zigzag_indices(x.shape[axis], cp)), axis=axis)


def zigzag_unpermute(x: Array, cp: int, axis: int = 1) -> Array:
    """Zigzag layout -> natural order along `axis` (inverse of `zigzag_permute`)."""
    if cp == 1:
        return x
    inv = np.argsort(zigzag_indices(x.shape[axis], cp))
    return jnp.take(x, jnp.asarray(inv), axis=axis)


def zigzag_shift_left(x: Array, k: int, cp: int, fill=0) -> Array:
    """On a zigzag-laid-out ``[b, S, ...]`` array: the value of natural position ``n + k`` at the slot of
    natural position n (`fill` past the end), i.e. ``zigzag_permute(shift_left(zigzag_unpermute(x), k))``
    as one static gather. What MTP's natural-order shifts become under CP (`horizon.model.mtp`)."""
    S = x.shape[1]
    idx = zigzag_indices(S, cp)
    src = idx + k
    slots = np.argsort(idx)[np.minimum(src, S - 1)]
    ok = jnp.asarray(src < S).reshape((1, S) + (1,) * (x.ndim - 2))
    return jnp.where(ok, jnp.take(x, jnp.asarray(slots), axis=1), jnp.asarray(fill, x.dtype))


def _local_attention(p, x, positions, segment_ids, seq_index, all_index, *, cfg):
    """Body on one device: x [b, s_l, D] in zigzag layout; all_index [S] true index of every slot.
    The local latent (the small [Rkv + r] vector per token) is all-gathered over ``context``, then
    `mla.core_attention` runs the local queries over it, causal on true indices."""
    tables = rope.rope_tables(cfg)
    R = cfg.kv_lora_rank
    c, k_rope = mla.kv_latent(p, x, positions, cfg, tables)
    latent = jnp.concatenate([c, k_rope], axis=-1)                     # [b, s_l, Rkv + r]
    lat_all = jax.lax.all_gather(latent, pmesh.SEQ_AXIS, axis=1, tiled=True)  # [b, S, Rkv + r]
    seg_all = jax.lax.all_gather(segment_ids, pmesh.SEQ_AXIS, axis=1, tiled=True)
    q_nope, q_rope = mla.queries(p, x, positions, cfg, tables)          # overlappable with the gather
    b = x.shape[0]
    q_index = jnp.broadcast_to(seq_index, (b, seq_index.shape[0]))      # causal on true indices
    kv_index = jnp.broadcast_to(all_index, (b, all_index.shape[0]))
    return mla.core_attention(p, q_nope, q_rope, lat_all[..., :R], lat_all[..., R:], q_index, kv_index,
                              segment_ids, seg_all, cfg=cfg)


def cp_attention(
    p: dict,
    x: Float[Array, "batch seq embed"],
    positions: Int[Array, "batch seq"],
    segment_ids: Int[Array, "batch seq"],
    *,
    cfg,
) -> Float[Array, "batch seq embed"]:
    """MLA over a zigzag-laid-out sequence split across the ``context`` axis of the current mesh
    (`jax.set_mesh`). Same result as `mla.attention` on the natural-order sequence (permuted)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or pmesh.SEQ_AXIS not in mesh.axis_names:
        raise ValueError("cp_attention needs a mesh with a 'context' axis set via jax.set_mesh")
    cp = mesh.shape[pmesh.SEQ_AXIS]
    S = x.shape[1]
    idx = jnp.asarray(zigzag_indices(S, cp), jnp.int32)
    act, tok = P(pmesh.BATCH_AXES, pmesh.SEQ_AXIS, None), P(pmesh.BATCH_AXES, pmesh.SEQ_AXIS)
    pspec = jax.tree.map(lambda _: P(), p)

    def body(p, x, pos, seg, idx_local, idx_all):
        return _local_attention(p, x, pos, seg, idx_local, idx_all, cfg=cfg)

    f = jax.shard_map(body, mesh=mesh, in_specs=(pspec, act, tok, tok, P(pmesh.SEQ_AXIS), P()), out_specs=act)
    layout = cfg.get("cp_layout", "zigzag")
    if layout == "zigzag":   # the caller already laid the sequence out (the efficient path)
        return f(p, x, positions, segment_ids, idx, idx)
    if layout == "natural":  # natural-order callers (e.g. the RL trainer): permute around the layer
        out = f(p, zigzag_permute(x, cp), zigzag_permute(positions, cp), zigzag_permute(segment_ids, cp), idx, idx)
        return zigzag_unpermute(out, cp)
    raise ValueError(f"cp_layout={layout!r}; expected 'zigzag' or 'natural'")


mla.register_attention_impl(IMPL_NAME, cp_attention)
