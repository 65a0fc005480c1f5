"""Blockwise (flash-style) attention in pure JAX: memory linear in the sequence (docs/SPEC.md §1.4).

Queries are cut into blocks of ``block_q`` rows and keys/values into blocks of ``block_kv``. For each
query block an online softmax runs over the key blocks (running max ``m``, normaliser ``l`` and the
value accumulator, all float32), so no ``[q, kv]`` score or mask array ever exists: the largest
temporary is one ``[b, H, block_q, block_kv]`` score block. The backward pass (`jax.custom_vjp`)
recomputes each block's scores from the saved log-sum-exp (FlashAttention-2, Dao 2023, Alg. 2) and
keeps only ``dq``, ``dk``, ``dv`` (linear) as loop carries.

Masks come from per-token integers, never from a mask array: query ``i`` sees key ``j`` iff
``kv_index[j] <= q_index[i]`` and ``kv_seg[j] == q_seg[i]``. The indices are sequence positions in
the training path, true (natural-order) indices in the context-parallel zigzag layout, and
(cache slot, token position) in the engine's prefill chunks. A block pair none of whose entries can
be visible in any row (every key index above every query index, or disjoint segment ranges) is
skipped with `jax.lax.cond`: about half the pairs for a causal sequence, and every slot block past
the prompt in a prefill over a cache.

`reference_attention` is the dense computation (the ``[q, kv]`` scores materialised): the reference
the tests compare against and the baseline benchmarks measure (``model.attention_kernel = "dense"``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

KERNELS = ("blockwise", "dense")
_KV_PAD_INDEX = jnp.iinfo(jnp.int32).max   # padded keys: above every query index, never visible
_Q_PAD_INDEX = -1                          # padded queries: below every key index, see nothing


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _pad_tokens(x: Array, axis: int, size: int, value=None) -> Array:
    """Pad `x` along `axis` to `size` with `value` (None: repeat the edge, keeping index ranges tight)."""
    extra = size - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    if value is None:
        return jnp.pad(x, widths, mode="edge")
    return jnp.pad(x, widths, constant_values=value)


def _visible(qi: Array, ki: Array, qs: Array, ks: Array) -> Array:
    """[b, tq, tk] bool: key visible from query (causal on indices, same segment)."""
    return (ki[:, None, :] <= qi[:, :, None]) & (ks[:, None, :] == qs[:, :, None])


def _live_pairs(qi, ki, qs, ks, bq: int, bk: int) -> Array:
    """[nq, nk] bool: block pair (i, j) may hold a visible entry in some row (else it is skipped)."""
    b = qi.shape[0]

    def ranges(x, n):
        x = x.reshape(b, -1, n)
        return x.min(-1), x.max(-1)

    _, q_max = ranges(qi, bq)
    k_min, _ = ranges(ki, bk)
    qs_min, qs_max = ranges(qs, bq)
    ks_min, ks_max = ranges(ks, bk)
    causal = k_min[:, None, :] <= q_max[:, :, None]
    overlap = (ks_min[:, None, :] <= qs_max[:, :, None]) & (qs_min[:, :, None] <= ks_max[:, None, :])
    return jnp.any(causal & overlap, axis=0)


def _zero(*arrays: Array) -> Array:
    """A float32 scalar 0 that depends on every input: loop carries and `cond` branches built from it
    vary over the same mesh axes as the computed blocks inside `jax.shard_map` (the CP path)."""
    return sum(a.reshape(-1)[0].astype(jnp.float32) * 0 for a in arrays)


def _loop(n: int, body, init):
    """``fori_loop(0, n, body, init)`` as a `while_loop`. A scan-based loop inside a differentiated
    layer scan gets split by JAX's partial evaluation into a part that depends only on loop
    invariants (block slices of keys, masks from positions) and the rest, with the invariant part's
    values stacked per iteration: [q blocks, kv blocks, ...] arrays, quadratic memory again. A
    while loop is never split that way."""
    def step(c):
        return c[0] + 1, body(c[0], c[1])

    return jax.lax.while_loop(lambda c: c[0] < n, step, (jnp.int32(0), init))[1]


def _block(x: Array, j, n: int, axis: int) -> Array:
    return jax.lax.dynamic_slice_in_dim(x, j * n, n, axis=axis)


def _scores(qb, kb, qib, kib, qsb, ksb, scale):
    """Masked f32 scores of one block pair [b, H, bq, bk] (-inf where not visible) and the mask."""
    s = jax.lax.dot_general(qb, kb, (((3,), (3,)), ((0, 1), (0, 1))), preferred_element_type=jnp.float32)
    vis = _visible(qib, kib, qsb, ksb)[:, None]
    return jnp.where(vis, s * scale, -jnp.inf), vis


def _forward(q, k, v, qi, ki, qs, ks, scale, bq, bk):
    """(out [b, H, t, dv] in q's dtype, lse [b, H, t] f32) on block-padded inputs."""
    b, H, t, _ = q.shape
    s, dv = k.shape[2], v.shape[-1]
    nk = s // bk
    live = _live_pairs(qi, ki, qs, ks, bq, bk)
    zero = _zero(q, k, v, qi, ki, qs, ks)

    def q_block(i, carry):
        out, lse = carry
        qb, qib, qsb = _block(q, i, bq, 2), _block(qi, i, bq, 1), _block(qs, i, bq, 1)

        def kv_step(j, carry):
            def update(carry):
                m, norm, acc = carry
                sc, _ = _scores(qb, _block(k, j, bk, 2), qib, _block(ki, j, bk, 1), qsb, _block(ks, j, bk, 1), scale)
                m_new = jnp.maximum(m, sc.max(-1))
                m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)      # rows with nothing visible yet
                p = jnp.exp(sc - m_safe[..., None])
                corr = jnp.exp(m - m_safe)
                pv = jax.lax.dot_general(p.astype(v.dtype), _block(v, j, bk, 2), (((3,), (2,)), ((0, 1), (0, 1))),
                                         preferred_element_type=jnp.float32)
                return m_new, norm * corr + p.sum(-1), acc * corr[..., None] + pv

            return jax.lax.cond(live[i, j], update, lambda c: c, carry)

        init = (jnp.full((b, H, bq), -jnp.inf, jnp.float32) + zero, jnp.zeros((b, H, bq), jnp.float32) + zero,
                jnp.zeros((b, H, bq, dv), jnp.float32) + zero)
        m, norm, acc = _loop(nk, kv_step, init)
        seen = norm > 0                                # padded query rows see nothing: output 0
        o = (acc / jnp.where(seen, norm, 1.0)[..., None]).astype(q.dtype)
        lse_i = jnp.where(seen, m + jnp.log(jnp.where(seen, norm, 1.0)), 0.0)
        return (jax.lax.dynamic_update_slice_in_dim(out, o, i * bq, axis=2),
                jax.lax.dynamic_update_slice_in_dim(lse, lse_i, i * bq, axis=2))

    init = (jnp.zeros((b, H, t, dv), q.dtype) + zero.astype(q.dtype), jnp.zeros((b, H, t), jnp.float32) + zero)
    return _loop(t // bq, q_block, init)


def _backward(q, k, v, qi, ki, qs, ks, out, lse, do, scale, bq, bk):
    """(dq, dk, dv) by recomputing each live block pair's probabilities from `lse`."""
    nq, nk = q.shape[2] // bq, k.shape[2] // bk
    live = _live_pairs(qi, ki, qs, ks, bq, bk)
    delta = jnp.sum(do.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)     # [b, H, t]
    f32 = jnp.float32
    bdims = ((0, 1), (0, 1))

    def kv_block(j, carry):
        dq, dk, dv = carry
        kb, vb, kib, ksb = _block(k, j, bk, 2), _block(v, j, bk, 2), _block(ki, j, bk, 1), _block(ks, j, bk, 1)

        def q_step(i, inner):
            def update(inner):
                dq, dkj, dvj = inner
                qb, dob = _block(q, i, bq, 2), _block(do, i, bq, 2)
                sc, vis = _scores(qb, kb, _block(qi, i, bq, 1), kib, _block(qs, i, bq, 1), ksb, scale)
                p = jnp.where(vis, jnp.exp(sc - _block(lse, i, bq, 2)[..., None]), 0.0)     # [b, H, bq, bk]
                dvj = dvj + jax.lax.dot_general(p.astype(dob.dtype), dob, (((2,), (2,)), bdims),
                                                preferred_element_type=f32)
                dp = jax.lax.dot_general(dob, vb, (((3,), (3,)), bdims), preferred_element_type=f32)
                ds = p * (dp - _block(delta, i, bq, 2)[..., None]) * scale
                dkj = dkj + jax.lax.dot_general(ds.astype(qb.dtype), qb, (((2,), (2,)), bdims),
                                                preferred_element_type=f32)
                dqi = jax.lax.dot_general(ds.astype(kb.dtype), kb, (((3,), (2,)), bdims), preferred_element_type=f32)
                dq = jax.lax.dynamic_update_slice_in_dim(dq, _block(dq, i, bq, 2) + dqi, i * bq, axis=2)
                return dq, dkj, dvj

            return jax.lax.cond(live[i, j], update, lambda c: c, inner)

        zeros_k = jnp.zeros(kb.shape, f32) + zero
        zeros_v = jnp.zeros(vb.shape, f32) + zero
        dq, dkj, dvj = _loop(nq, q_step, (dq, zeros_k, zeros_v))
        dk = jax.lax.dynamic_update_slice_in_dim(dk, dkj, j * bk, axis=2)
        dv = jax.lax.dynamic_update_slice_in_dim(dv, dvj, j * bk, axis=2)
        return dq, dk, dv

    zero = _zero(q, k, v, qi, ki, qs, ks, lse, do)
    init = (jnp.zeros(q.shape, f32) + zero, jnp.zeros(k.shape, f32) + zero, jnp.zeros(v.shape, f32) + zero)
    dq, dk, dv = _loop(nk, kv_block, init)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def _flash(q, k, v, qi, ki, qs, ks, scale, bq, bk):
    return _forward(q, k, v, qi, ki, qs, ks, scale, bq, bk)[0]


def _flash_fwd(q, k, v, qi, ki, qs, ks, scale, bq, bk):
    out, lse = _forward(q, k, v, qi, ki, qs, ks, scale, bq, bk)
    return out, (q, k, v, qi, ki, qs, ks, out, lse)


def _flash_bwd(scale, bq, bk, res, do):
    q, k, v, qi, ki, qs, ks, out, lse = res
    dq, dk, dv = _backward(q, k, v, qi, ki, qs, ks, out, lse, do, scale, bq, bk)
    return dq, dk, dv, None, None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def attention(
    q: Float[Array, "batch heads q dk"],
    k: Float[Array, "batch heads kv dk"],
    v: Float[Array, "batch heads kv dv"],
    q_index: Int[Array, "batch q"],
    kv_index: Int[Array, "batch kv"],
    q_seg: Int[Array, "batch q"],
    kv_seg: Int[Array, "batch kv"],
    *,
    scale: float,
    block_q: int,
    block_kv: int,
) -> Float[Array, "batch heads q dv"]:
    """softmax(scale * q k^T, masked) v without a [q, kv] array (module docstring). Any lengths:
    blocks are ``min(block, length)`` and the inputs are padded to a multiple internally."""
    t, s = q.shape[2], k.shape[2]
    bq, bk = min(block_q, t), min(block_kv, s)
    tp, sp = _round_up(t, bq), _round_up(s, bk)
    i32 = jnp.int32
    out = _flash(_pad_tokens(q, 2, tp, 0), _pad_tokens(k, 2, sp, 0), _pad_tokens(v, 2, sp, 0),
                 _pad_tokens(q_index.astype(i32), 1, tp, _Q_PAD_INDEX),
                 _pad_tokens(kv_index.astype(i32), 1, sp, _KV_PAD_INDEX),
                 _pad_tokens(q_seg.astype(i32), 1, tp), _pad_tokens(kv_seg.astype(i32), 1, sp),
                 float(scale), bq, bk)
    return out[:, :, :t]


def reference_attention(
    q: Float[Array, "batch heads q dk"],
    k: Float[Array, "batch heads kv dk"],
    v: Float[Array, "batch heads kv dv"],
    q_index: Int[Array, "batch q"],
    kv_index: Int[Array, "batch kv"],
    q_seg: Int[Array, "batch q"],
    kv_seg: Int[Array, "batch kv"],
    *,
    scale: float,
) -> Float[Array, "batch heads q dv"]:
    """The dense computation `attention` must equal: full [b, H, q, kv] f32 scores and mask."""
    bd = ((0, 1), (0, 1))
    s = jax.lax.dot_general(q, k, (((3,), (3,)), bd), preferred_element_type=jnp.float32) * scale
    vis = _visible(q_index, kv_index, q_seg, kv_seg)[:, None]
    probs = jax.nn.softmax(jnp.where(vis, s, -1e30), axis=-1).astype(v.dtype)
    return jax.lax.dot_general(probs, v, (((3,), (2,)), bd)).astype(q.dtype)
