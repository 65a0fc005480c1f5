"""The LM head over token chunks: log-probs, entropy and the MTP distillation KL without a
[tokens, vocab] logits array (docs/SPEC.md §1.4).

A training loss needs a few numbers per token (the target's log-prob, the entropy, a KL), but the
head makes float32 logits over the whole vocabulary first: 4 GiB for one 32k-token row at a 32k
vocabulary, kept by autodiff (with their softmax) for the backward. `over_chunks` runs the head
``model.head_chunk`` tokens at a time in a `jax.lax.scan` whose body is under `jax.checkpoint`:
the forward keeps only the per-token results, the backward recomputes one chunk's logits at a
time, and the head weight's gradient accumulates through the scan. Memory per step is
O(chunk x vocab) instead of O(tokens x vocab), for one more head matmul in the backward.

A chunk is a strided slice of the sequence axis of every row (positions ``i, i+n, i+2n, ...`` of
each row in chunk ``i`` of ``n``), so each chunk keeps the rows' batch sharding and a
context-parallel split of the sequence (docs/SPEC.md §2): no chunk lives on some devices only.
At most ``head_chunk`` tokens (or ``head_chunk = 0``) run the head once, directly, exactly the
full-logits computation; that is what short contexts run, at their old speed.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from horizon.model import transformer


def chunk_size(cfg) -> int:
    """Tokens per head chunk (``model.head_chunk``; 0, or a config from before the field: no chunks)."""
    return int(transformer.model_cfg(cfg).get("head_chunk", 0))


def head_params(params: dict) -> dict:
    """The head's leaves: ``final_norm`` and ``lm_head`` (``embed`` with tied embeddings)."""
    w = "lm_head" if "lm_head" in params else "embed"
    return {"final_norm": params["final_norm"], w: params[w]}


def over_chunks(fn: Callable, consts, xs: tuple[Array, ...], chunk: int):
    """``fn(consts, *xs)`` for a per-token `fn` over ``[b, s, ...]`` inputs, about `chunk` tokens
    at a time (module docstring); outputs are ``[b, s, ...]`` like `fn`'s on the whole input.

    `fn` must treat tokens independently (a token's output reads only its own inputs); padded
    positions (the sequence rounded up to a multiple of the steps) see zeros and are dropped."""
    b, s = xs[0].shape[:2]
    if chunk <= 0 or b * s <= chunk:
        return fn(consts, *xs)
    n = min(s, -(-b * s // chunk))          # scan steps
    cs = -(-s // n)                         # positions of each row per step
    pad = n * cs - s

    def split(x):                           # [b, s, ...] -> [n, b, cs, ...]: chunk i = positions i mod n
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return jnp.moveaxis(x.reshape(b, cs, n, *x.shape[2:]), 2, 0)

    def merge(y):                           # [n, b, cs, ...] -> [b, s, ...]
        return jnp.moveaxis(y, 0, 2).reshape(b, n * cs, *y.shape[3:])[:, :s]

    body = jax.checkpoint(fn, prevent_cse=False)   # keep no logits: recompute them per chunk
    _, ys = jax.lax.scan(lambda carry, x: (carry, body(consts, *x)), None, tuple(split(x) for x in xs))
    return jax.tree.map(merge, ys)


def logit_stats(
    logits: Float[Array, "*b vocab"], targets: Int[Array, "*b"]
) -> tuple[Float[Array, "*b"], Float[Array, "*b"]]:
    """(log-prob of `targets`, entropy) of ``softmax(logits)`` in float32, from one logsumexp and no
    log-prob array: ``logp = logit[target] - lse``, ``entropy = lse - sum(softmax * logits)``, the
    latter on logits shifted by their max (the difference then loses at most log(vocab) to
    rounding). A caller that drops the entropy pays nothing for it (XLA removes it), and the
    log-prob alone is `jax.nn.logsumexp`'s form: on XLA:CPU one explicit shifted ``exp`` shared by
    both made the head's forward + backward ~10% slower."""
    x = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(x, axis=-1)
    logp = jnp.take_along_axis(x, targets[..., None].astype(jnp.int32), axis=-1)[..., 0] - lse
    m = jax.lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))
    entropy = (lse - m[..., 0]) - jnp.sum(jnp.exp(x - lse[..., None]) * (x - m), axis=-1)
    return logp, entropy


def token_logprobs(
    params: dict, hidden: Float[Array, "b s embed"], targets: Int[Array, "b s"], *, cfg
) -> tuple[Float[Array, "b s"], Float[Array, "b s"]]:
    """(log-prob of ``targets[:, t]``, entropy) under ``transformer.lm_logits(params, hidden[:, t])``,
    chunked by ``model.head_chunk``: the LM cross-entropy (``-logp``), the RL policy's and the
    reference's log-probs. `hidden` is the trunk's output before ``final_norm``."""
    c = transformer.model_cfg(cfg)

    def fn(hp, h, t):
        return logit_stats(transformer.lm_logits(hp, h, cfg=c), t)

    return over_chunks(fn, head_params(params), (hidden, targets), chunk_size(c))


def token_kl(
    teacher: dict, teacher_hidden: Float[Array, "b s embed"],
    student: dict, student_hidden: Float[Array, "b s embed"], *, cfg,
) -> Float[Array, "b s"]:
    """Per-token ``KL(stop_grad(p_teacher) || p_student)`` of two heads (`head_params`-like dicts, e.g.
    the main head and an MTP depth's), chunked by ``model.head_chunk``: MTP self-distillation
    (docs/SPEC.md §1.3) with neither side's logits whole. The teacher side gets no gradient."""
    c = transformer.model_cfg(cfg)

    def fn(hps, ht, hs):
        tp, sp = hps
        logp = jax.nn.log_softmax(jax.lax.stop_gradient(transformer.lm_logits(tp, ht, cfg=c)), axis=-1)
        logq = jax.nn.log_softmax(transformer.lm_logits(sp, hs, cfg=c), axis=-1)
        return jnp.sum(jnp.exp(logp) * (logp - logq), axis=-1)

    return over_chunks(fn, (jax.lax.stop_gradient(teacher), student), (teacher_hidden, student_hidden), chunk_size(c))
