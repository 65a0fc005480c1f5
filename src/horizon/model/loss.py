"""Next-token cross-entropy for packed sequences (docs/SPEC.md §8).

Position ``t`` predicts ``tokens[t+1]``; the pair counts iff ``t+1 < s``, both tokens are in the same
segment (no cross-segment targets) and ``mask[t+1]`` is set (`mask` marks tokens that are targets,
e.g. 0 on padding / prompt tokens). Loss = sum of CE over counted pairs / their number.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int


def shift_left(x: Array, k: int, fill=0) -> Array:
    """``x[:, t + k]`` at position t of a natural-order ``[b, s, ...]`` array, `fill` past the end. The
    losses' shifts are parameters taking this signature: `horizon.parallel.context.zigzag_shift_left`
    is the same shift on the context-parallel layout."""
    pad = jnp.full((x.shape[0], min(k, x.shape[1])) + x.shape[2:], fill, x.dtype)
    return jnp.concatenate([x[:, k:], pad], axis=1)[:, : x.shape[1]]


def next_token_targets(
    tokens: Int[Array, "b s"], mask: Array | None = None, segment_ids: Int[Array, "b s"] | None = None,
    *, shift=shift_left,
) -> tuple[Int[Array, "b s"], Float[Array, "b s"]]:
    """Shifted targets [b, s] (last position padded with 0) and their float weights [b, s]."""
    seg = jnp.zeros(tokens.shape, jnp.int32) if segment_ids is None else segment_ids
    tgt = shift(tokens, 1, fill=0)
    wf = (shift(seg, 1, fill=-1) == seg).astype(jnp.float32)     # in range and in the same segment
    if mask is not None:
        wf = wf * shift(mask.astype(jnp.float32), 1, fill=0.0)
    return tgt, wf


def next_token_loss(
    logits: Float[Array, "b s vocab"],
    tokens: Int[Array, "b s"],
    *,
    mask: Array | None = None,
    segment_ids: Int[Array, "b s"] | None = None,
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """(mean cross-entropy over counted targets, number of counted targets)."""
    tgt, w = next_token_targets(tokens, mask, segment_ids)
    logits = logits.astype(jnp.float32)
    # log_softmax at the target only: no [b, s, V] log-prob array (fewer full-vocab passes)
    logp = jnp.take_along_axis(logits, tgt[..., None], axis=-1)[..., 0] - jax.nn.logsumexp(logits, axis=-1)
    return mean_nll(logp, w)


def mean_nll(logp: Float[Array, "b s"], w: Float[Array, "b s"]) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """(weighted mean of ``-logp``, total weight): the CE of target log-probs (`next_token_loss`, or
    the chunked head's `horizon.model.head.token_logprobs` in the train step)."""
    count = w.sum()
    return -jnp.sum(logp * w) / jnp.maximum(count, 1.0), count
