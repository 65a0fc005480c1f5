"""Long-context evaluation: held-out loss per position bucket and passkey accuracy by length
(docs/SPEC.md §1.4, §8).

Both read a model through a `Scorer`, a function of a token batch ``[b, s]`` (one document per
row, positions 0..s-1) returning ``(nll [b, s-1], argmax [b, s])``, so the tests can pass an oracle
or a blind scorer and the run passes the model (`model_scorer`: one forward gives both):

- ``nll``: the next-token loss of target ``t`` (``tokens[:, t]``, t >= 1).
  `bucket_losses` averages it per bucket of the target's position, ``[0, m_1 L), [m_1 L, m_2 L),
  ...`` for ``long_eval.multiples = (m_1, m_2, ...)`` and L the short stage's ``data.seq_len``
  (default (1, 4, 16): [0, L), [L, 4L), [4L, 16L)), over held-out documents at least ``max(m) L``
  tokens long cut to that length (`heldout_long_docs`): every bucket sees the same documents.
- ``argmax``: the argmax next token after each position. `passkey_accuracy` is
  the exact match of every answer token of a passkey document (`horizon.data.passkey`, the key at a
  random depth, filler to ``m L`` tokens) under teacher forcing: equal to greedy decoding's exact
  match, since greedy decoding emits the key iff each of its tokens is the argmax after the ones
  before. Also reported: the fraction of answer tokens right (``passkey_digit_acc``).

`evaluate` gives one flat record (``loss_<a>_<b>``, ``tokens_<a>_<b>``, ``passkey_acc_<n>``,
``passkey_digit_acc_<n>``); experiments/pretrain.py logs it before the long stage (the short model
with its own RoPE, and with the long stage's RoPE scaling) and after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jaxtyping import Array, Float, Int

from horizon.data import passkey, pipeline
from horizon.data.tokenizer import tokenizer_from_config
from horizon.model import transformer
from horizon.utils.config import need, need_int
from horizon.utils.progress import progress

Scorer = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]   # tokens [b, s] -> (nll [b, s-1], argmax [b, s])


def bucket_edges(short_len: int, multiples: Sequence[int]) -> list[tuple[int, int]]:
    """[(0, m_1 L), (m_1 L, m_2 L), ...] (module docstring)."""
    ends = [int(m) * int(short_len) for m in multiples]
    return list(zip([0, *ends[:-1]], ends))


def token_scores(params: Any, tokens: Int[Array, "b s"], *, cfg) -> tuple[Float[Array, "b s1"], Int[Array, "b s"]]:
    """(next-token loss of every target ``tokens[:, 1:]``, the argmax next token after each position)
    of one document per row."""
    logits, _ = transformer.forward(params, tokens, cfg=cfg)
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    return nll, jnp.argmax(logits, axis=-1).astype(jnp.int32)


def model_scorer(params: Any, model_cfg: ml_collections.ConfigDict) -> Scorer:
    """A model's `Scorer` (`token_scores`) on one device (params gathered from any mesh), jitted once
    per batch shape."""
    fn = jax.jit(partial(token_scores, cfg=model_cfg))
    params = jax.device_put(jax.device_get(params), jax.devices()[0])

    def score(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        nll, pred = jax.device_get(fn(params, jnp.asarray(tokens)))
        return np.asarray(nll), np.asarray(pred)
    return score


def _batches(rows: np.ndarray, batch_size: int):
    """(batch, real rows) over `rows`, the last batch padded with copies of row 0 (one compile shape)."""
    for i in range(0, len(rows), batch_size):
        b = rows[i:i + batch_size]
        n = len(b)
        if n < batch_size:
            b = np.concatenate([b, np.repeat(rows[:1], batch_size - n, axis=0)])
        yield b, n


def bucket_losses(score: Scorer, docs: Int[np.ndarray, "n s"], edges: Sequence[tuple[int, int]], *,
                  batch_size: int) -> dict[str, float]:
    """Mean next-token loss of the targets whose position lies in each bucket, and their count."""
    sums, counts = np.zeros(len(edges)), np.zeros(len(edges))
    pos = np.arange(1, docs.shape[1])                       # target positions
    which = [(pos >= a) & (pos < b) for a, b in edges]
    for b, n in _batches(np.asarray(docs, np.int32), batch_size):
        v = np.asarray(score(b)[0], np.float64)[:n]
        for j, w in enumerate(which):
            sums[j] += v[:, w].sum()
            counts[j] += v[:, w].size
    out = {}
    for (a, b), s, c in zip(edges, sums, counts):
        out[f"loss_{a}_{b}"] = float(s / c) if c else float("nan")
        out[f"tokens_{a}_{b}"] = int(c)
    return out


def passkey_accuracy(score: Scorer, docs: Sequence[passkey.PasskeyDoc], *, batch_size: int
                     ) -> dict[str, float]:
    """Exact match of the whole key (``acc``) and the fraction of key tokens right (``digit_acc``) under
    teacher-forced argmax; the documents must be of one length."""
    rows = np.stack([d.tokens for d in docs])
    exact, right, total = 0, 0, 0
    k = 0
    for b, n in _batches(rows, batch_size):
        pred = np.asarray(score(b)[1])
        for i in range(n):
            d = docs[k]
            k += 1
            ok = pred[i, d.answer_start - 1:d.answer_start - 1 + d.answer_len] == d.tokens[d.answer]
            exact, right, total = exact + bool(ok.all()), right + int(ok.sum()), total + d.answer_len
    return {"acc": exact / len(docs), "digit_acc": right / max(total, 1)}


def heldout_long_docs(cfg: ml_collections.ConfigDict, length: int, n: int) -> Int[np.ndarray, "k length"]:
    """The first `n` held-out documents (seeded order) of at least `length` tokens, cut to `length`."""
    docs = [d[:length] for d in pipeline.documents(cfg, "heldout") if d.size >= length][:n]
    if not docs:
        raise ValueError(f"no held-out document has {length} tokens (data.sources {list(cfg.data.sources)})")
    return np.stack(docs).astype(np.int32)


def evaluate(cfg: ml_collections.ConfigDict, score: Scorer, *, desc: str = "long-context eval") -> dict[str, float]:
    """One flat record (module docstring) for the base config `cfg` (its ``data`` and ``long_eval``)."""
    e, short = cfg.long_eval, int(cfg.data.seq_len)
    tok = tokenizer_from_config(cfg)
    lengths = [int(m) * short for m in e.multiples]
    out = bucket_losses(score, heldout_long_docs(cfg, lengths[-1], int(e.heldout_docs)),
                        bucket_edges(short, e.multiples), batch_size=int(e.batch_size))
    for n in progress(lengths, desc=desc, unit="length"):
        docs = passkey.passkey_documents(tok, n, int(e.passkey_docs), seed=int(e.seed), stream=passkey.EVAL_STREAM,
                                         digits=int(cfg.data.get("passkey_digits", 5)))
        acc = passkey_accuracy(score, docs, batch_size=max(1, int(e.batch_size) * lengths[-1] // n))
        out[f"passkey_acc_{n}"], out[f"passkey_digit_acc_{n}"] = acc["acc"], acc["digit_acc"]
    return out


def validate_long_eval(cfg: ml_collections.ConfigDict) -> None:
    """``long_eval`` (configs/pretrain_long.py), needed by a config with ``stages``: `ConfigError`."""
    if "stages" not in cfg:
        return
    need("long_eval" in cfg, "long_eval", None, "a config with stages needs a long_eval section")
    e = cfg.long_eval
    ms = tuple(e.multiples)
    need(len(ms) >= 1 and all(isinstance(m, int) and m >= 1 for m in ms) and list(ms) == sorted(set(ms)),
         "long_eval.multiples", ms, "must be increasing positive integers")
    for k in ("passkey_docs", "heldout_docs", "batch_size"):
        need_int(e, k, "long_eval", lo=1)
    need_int(e, "seed", "long_eval", lo=0)
    tok = tokenizer_from_config(cfg)
    lo = passkey.min_length(tok, int(cfg.data.get("passkey_digits", 5))) + 2
    need(ms[0] * int(cfg.data.seq_len) >= lo, "long_eval.multiples", ms,
         f"the shortest passkey length {ms[0]} * data.seq_len must be >= {lo} tokens")
    need(ms[-1] * int(cfg.data.seq_len) <= int(cfg.stages.long.seq_len), "long_eval.multiples", ms,
         f"the longest length {ms[-1]} * data.seq_len must be <= stages.long.seq_len={cfg.stages.long.seq_len}")


def table(records: dict[str, dict]) -> str:
    """Markdown: one row per evaluated model (``records[name]``), a column per bucket loss and length."""
    keys = [k for k in next(iter(records.values())) if k.startswith(("loss_", "passkey_acc_"))]
    head = "| model | " + " | ".join(keys) + " |\n|---|" + "---|" * len(keys) + "\n"
    return head + "".join(f"| {name} | " + " | ".join(f"{r[k]:.3f}" for k in keys) + " |\n"
                          for name, r in records.items())
