"""Next-token cross-entropy for packed sequences (docs/SPEC.md §8).

Position ``t`` predicts ``tokens[t+1]``; the pair counts iff ``t+1 < s``, both tokens are in the same
segment (no cross-segment targets) and ``mask[t+1]`` is set (`mask` marks tokens that are targets,
e.g. 0 on padding / prompt tokens). Loss = sum of CE over counted pairs / their number.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int


def next_token_targets(
    tokens: Int[Array, "b s"], mask: Array | None = None, segment_ids: Int[Array, "b s"] | None = None
) -> tuple[Int[Array, "b s"], Float[Array, "b s"]]:
    """Shifted targets [b, s] (last position padded with 0) and their float weights [b, s]."""
    b, s = tokens.shape
    tgt = jnp.concatenate([tokens[:, 1:], jnp.zeros((b, 1), tokens.dtype)], axis=1)
    w = jnp.concatenate([jnp.ones((b, s - 1), bool), jnp.zeros((b, 1), bool)], axis=1)
    if segment_ids is not None:
        w = w & jnp.concatenate([segment_ids[:, 1:] == segment_ids[:, :-1], jnp.zeros((b, 1), bool)], axis=1)
    wf = w.astype(jnp.float32)
    if mask is not None:
        wf = wf * jnp.concatenate([mask[:, 1:].astype(jnp.float32), jnp.zeros((b, 1), jnp.float32)], axis=1)
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
    # -log_softmax at the target only: no [b, s, V] log-prob array (fewer full-vocab passes)
    nll = jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(logits, tgt[..., None], axis=-1)[..., 0]
    count = w.sum()
    return jnp.sum(nll * w) / jnp.maximum(count, 1.0), count
