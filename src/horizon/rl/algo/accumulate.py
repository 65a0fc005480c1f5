"""Gradient accumulation over a split batch, on the host side (docs/SPEC.md §4, docs/INFERENCE.md "Compile once").

A batch split by `batch.split_microbatches` ([M, rows, S]) is trained one micro-batch at a time:
`horizon.rl.algo.trainer` runs one jitted gradient step per micro-batch and one jitted update. So
that those compile once per run and not once per step, a micro-batch's shape comes from a bounded
set fixed by the config (`seq_buckets`): its rows are `rl.batch.micro_rows` and its length the
smallest bucket that holds its longest row (its trailing padding columns dropped, which changes
nothing: rows start at position 0 and padding is masked everywhere). M itself is a host loop count.

This module holds the host arithmetic: each micro-batch's share of the loss (`weights`), the trim
(`micro_batch`), and the combination of the micro-batches' metrics into the one-pass step's
(`combine`): the same formulas the one-pass loss uses, so the accumulated step equals it up to
float32 summation order (tests/rl/test_trainer.py).
"""

from __future__ import annotations

import numpy as np

from horizon.rl.algo import losses
from horizon.rl.algo.batch import ROW_FIELDS
from horizon.utils.shapes import bucket

SUMMED = ("loss", "pg_loss", "kl_loss")          # weighted like the loss
ROW_MEANS = ("adv_mean", "adv_abs_mean")         # means over (padded) rows
MASK_MEANS = ("entropy", "logprob_mean", "sampler_logprob_diff",   # means over loss_mask tokens (the
              "routing/own_vs_sampler", "routing/trained_vs_sampler")  # routing ones: those with a record); the
#                                     loss's own means are over its (overlong-masked) `num_tokens`
COUNTS = ("num_tokens", "tokens", "rows")        # summed over micro-batches (and `stale/lag_*`)


def seq_buckets(cfg) -> tuple[int, ...]:
    """The micro-batch lengths a run can train (`bucket` powers of two from `rl.batch.min_seq` up to the
    bucket of ``min(agent.max_context_tokens, model.max_seq_len)``, the longest segment a rollout
    makes; without an `agent` section, up to `model.max_seq_len`)."""
    longest = int(cfg.model.max_seq_len)
    if "agent" in cfg:
        longest = min(longest, int(cfg.agent.max_context_tokens))
    lo, hi = bucket(1, int(cfg.rl.batch.min_seq)), bucket(longest, int(cfg.rl.batch.min_seq))
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return tuple(out)


def weights(batch: dict, cfg) -> np.ndarray:
    """Each micro-batch's share [M] of the whole batch's loss. The loss normalises a micro-batch by its
    own count (real rows for "token_sum" without an explicit norm, masked tokens for "token_mean",
    non-empty rows for "seq_mean"); weighting by count / total turns that into the whole batch's
    normalisation, so the accumulated gradient equals the one-pass gradient. An explicit
    `token_sum_norm` is the same constant in every micro-batch (weight 1)."""
    lc = losses.loss_config(cfg.rl)
    m = np.asarray(batch["loss_mask"], np.float32)
    if lc.overlong_mask:
        m = m * (~np.asarray(batch["truncated"], bool))[..., None]
    if lc.agg == "token_sum":
        if lc.token_sum_norm:
            return np.ones(m.shape[:1], np.float32)
        cnt = np.sum(np.asarray(batch["row_chain"]) >= 0, axis=1)
    elif lc.agg == "token_mean":
        cnt = m.sum(axis=(1, 2))
    else:
        cnt = np.sum(m.sum(axis=2) > 0, axis=1)
    cnt = cnt.astype(np.float32)
    return cnt / max(float(cnt.sum()), 1.0)


def micro_batch(batch: dict, i: int, buckets: tuple[int, ...]) -> dict:
    """Micro-batch `i` of a split batch, its row fields cut to the smallest of `buckets` that holds
    its longest row (replay indices [L, rows * S', k] likewise)."""
    valid = np.asarray(batch["valid"][i])
    need = int(valid.any(axis=0).nonzero()[0].max()) + 1 if valid.any() else 1
    S = int(batch["tokens"].shape[-1])
    cut = next((b for b in buckets if b >= need), S)
    cut = min(cut, S)
    out = {k: np.asarray(batch[k][i])[:, :cut] if np.ndim(batch[k][i]) == 2 else np.asarray(batch[k][i])
           for k in ROW_FIELDS}
    rep = np.asarray(batch["replay_indices"][i])
    L, _, k = rep.shape
    r = out["tokens"].shape[0]
    out["replay_indices"] = rep.reshape(L, r, S, k)[:, :, :cut].reshape(L, r * cut, k)
    return out


def combine(ms: list[dict], w: np.ndarray, mask_counts: np.ndarray) -> dict[str, float]:
    """The micro-batches' metrics (host floats) as the one-pass step reports them: loss terms weighted
    like the loss (`w`), `COUNTS` summed, `*_max` maxed, `min_policy_version`
    minimised, row means averaged, loss-mask means weighted by each micro-batch's loss-mask count
    (`mask_counts`), the loss's own token means by its `num_tokens`."""
    share = lambda n: n / max(float(n.sum()), 1.0)  # noqa: E731
    tw_mask = share(np.asarray(mask_counts, np.float64))
    tw_loss = share(np.asarray([m["num_tokens"] for m in ms], np.float64))
    out = {}
    for k in ms[0]:
        v = np.asarray([m[k] for m in ms], np.float64)
        if k in SUMMED:
            out[k] = float(np.sum(w * v))
        elif k in COUNTS or k.startswith("stale/lag_"):
            out[k] = float(np.sum(v))
        elif k.endswith("_max"):
            out[k] = float(np.max(v))
        elif k == "min_policy_version":
            out[k] = float(np.min(v))
        elif k in ROW_MEANS:
            out[k] = float(np.mean(v))
        else:
            out[k] = float(np.sum((tw_mask if k in MASK_MEANS else tw_loss) * v))
    return out
