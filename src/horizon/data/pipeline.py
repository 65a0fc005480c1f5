"""Grain pretraining pipeline: files -> tokens -> packed rows -> batches (docs/SPEC.md §8).

Each document is `BOS + tokens + EOS`, split into pieces of at most `seq_len`, and the
pieces (in a seeded document order) are greedy-packed into rows (`packing.pack_sequences`);
with `data.passkey_fraction` > 0 the training split's pieces get synthetic passkey documents
mixed in first (`mix_passkeys`, docs/SPEC.md §8; their loss mask per `data.passkey_loss`). The
rows form a `grain.MapDataset` that is globally shuffled (reshuffled every epoch), repeated forever
and batched, so **batch k is a pure function of (data config, k)**: resuming at step k needs only k
(no iterator state), and any host can compute any batch.

A batch is a dict of numpy arrays `[batch, seq_len]`:
  tokens int32, segment_ids int32 (1..n per row, 0 = padding), positions int32 (reset
  per segment), mask float32 (1 = real, loss-bearing token, 0 on padding and on the parts of a
  passkey document `data.passkey_loss = "answer"` does not train; the loss additionally keeps
  only targets in the same segment as their input, see `packing.target_mask`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator

import grain
import ml_collections
import numpy as np

from horizon.data import packing, passkey, sources
from horizon.data.tokenizer import tokenizer_from_config

BATCH_KEYS = ("tokens", "segment_ids", "positions", "mask")


def make_tokenizer(cfg: ml_collections.ConfigDict):
    """The corpus tokenizer: the model's (`model.tokenizer`, `horizon.data.tokenizer`)."""
    return tokenizer_from_config(cfg)


def _data_key(cfg: ml_collections.ConfigDict, split: str) -> str:
    d = cfg.data
    return json.dumps(dict(root=str(sources.corpus_root(d)), sources=list(d.sources),
                           extensions=list(d.extensions), heldout=d.heldout_fraction, split=split,
                           seq_len=d.seq_len, tokenizer=str(cfg.model.get("tokenizer", "byte")),
                           vocab=cfg.model.vocab_size, seed=d.shuffle_seed), sort_keys=True)


def documents(cfg: ml_collections.ConfigDict, split: str) -> list[np.ndarray]:
    """A split's files as token arrays (`BOS + tokens + EOS`), in the seeded document order."""
    d = cfg.data
    tok = make_tokenizer(cfg)
    bos, eos = tok.bos_id is not None, tok.eos_id is not None
    docs = sources.file_source(d, split).map(
        lambda item: np.asarray(tok.encode(item[1], bos=bos, eos=eos), dtype=np.int32))
    return list(docs.shuffle(seed=d.shuffle_seed))


def passkey_length(d: ml_collections.ConfigDict) -> int:
    """Tokens per mixed-in passkey document: `data.passkey_len`, 0 = `data.seq_len`."""
    return int(d.get("passkey_len", 0) or d.seq_len)


def mix_passkeys(pieces: list[np.ndarray], cfg: ml_collections.ConfigDict
                 ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(sequences, their loss masks): `pieces` with passkey documents (`horizon.data.passkey`) making
    `data.passkey_fraction` of the result, each at a seeded position (the pieces keep their order); a
    piece's mask is all ones, a passkey document's `data.passkey_loss` ("all" | "answer") with its
    answer weighted `data.passkey_answer_weight`."""
    d = cfg.data
    n = passkey.mix_count(len(pieces), float(d.get("passkey_fraction", 0.0)))
    docs = passkey.passkey_documents(make_tokenizer(cfg), passkey_length(d), n, seed=d.shuffle_seed,
                                     digits=int(d.get("passkey_digits", 5)))
    at = np.sort(np.random.default_rng([passkey.TRAIN_STREAM, d.shuffle_seed]).integers(0, len(pieces) + 1, n))
    seqs, masks = list(pieces), [np.ones(p.size, np.float32) for p in pieces]
    loss, weight = str(d.get("passkey_loss", "all")), float(d.get("passkey_answer_weight", 1.0))
    for j, (i, doc) in enumerate(zip(at, docs)):       # i counts pieces before it; j passkeys already in
        seqs.insert(int(i) + j, doc.tokens)
        masks.insert(int(i) + j, doc.loss_mask(loss, weight))
    return seqs, masks


@functools.lru_cache(maxsize=8)
def _packed_rows(key: str, cfg_json: str) -> dict[str, np.ndarray]:
    cfg = ml_collections.ConfigDict(json.loads(cfg_json))
    d = cfg.data
    tok = make_tokenizer(cfg)
    split = json.loads(key)["split"]
    pieces = [p for doc in documents(cfg, split) for p in packing.chunk(doc, d.seq_len) if p.size > 1]
    if split != "train" or float(d.get("passkey_fraction", 0.0)) == 0.0:
        packed = packing.pack_sequences(pieces, d.seq_len, pad_id=tok.pad_id)
        mask = (packed.segment_ids > 0).astype(np.float32)
    else:
        seqs, masks = mix_passkeys(pieces, cfg)
        packed = packing.pack_sequences(seqs, d.seq_len, pad_id=tok.pad_id, extras={"mask": masks})
        mask = packed.extras["mask"]
    return dict(tokens=packed.tokens, segment_ids=packed.segment_ids, positions=packed.positions, mask=mask)


def packed_rows(cfg: ml_collections.ConfigDict, split: str) -> dict[str, np.ndarray]:
    """All packed rows of a split (cached per process; read-only arrays)."""
    cfg_json = json.dumps(dict(data=cfg.data.to_dict(), model=dict(vocab_size=cfg.model.vocab_size,
                                                                   tokenizer=str(cfg.model.get("tokenizer", "byte")))))
    rows = _packed_rows(_data_key(cfg, split), cfg_json)
    for v in rows.values():
        v.setflags(write=False)
    return rows


def dataset(cfg: ml_collections.ConfigDict, split: str) -> grain.MapDataset:
    """Infinite grain MapDataset of batches: `ds[k]` is batch k (docs/SPEC.md §8)."""
    d = cfg.data
    if d.batch_size <= 0 or d.seq_len <= 1:
        raise ValueError(f"need batch_size > 0 and seq_len > 1, got {d.batch_size}, {d.seq_len}")
    rows = packed_rows(cfg, split)
    n = rows["tokens"].shape[0]
    ds = grain.MapDataset.source(range(n)).map(lambda i: {k: rows[k][i] for k in BATCH_KEYS})
    seed = d.shuffle_seed + (0 if split == "train" else 1)
    return ds.shuffle(seed=seed).repeat().batch(d.batch_size, drop_remainder=True)


def make_batches(
    cfg: ml_collections.ConfigDict, split: str, start_step: int = 0, *,
    process_index: int = 0, process_count: int = 1,
) -> Iterator[dict[str, np.ndarray]]:
    """Batches `start_step, start_step+1, ...` of `split`; with `process_count > 1` each
    process gets its slice of the global batch (same global batch on every host)."""
    if start_step < 0:
        raise ValueError(f"start_step must be >= 0, got {start_step}")
    if cfg.data.batch_size % process_count:
        raise ValueError(f"batch_size {cfg.data.batch_size} not divisible by process_count {process_count}")
    ds = dataset(cfg, split)
    per = cfg.data.batch_size // process_count
    sl = slice(process_index * per, (process_index + 1) * per)
    ds = ds[start_step:].map(lambda b: {k: np.asarray(v[sl]) for k, v in b.items()})
    if cfg.data.worker_count > 0:  # background threads prefetch batches (same order, same values)
        opts = grain.ReadOptions(num_threads=cfg.data.worker_count, prefetch_buffer_size=2 * cfg.data.worker_count)
        yield from ds.to_iter_dataset(opts)
    else:
        for i in range(len(ds)):
            yield ds[i]


def eval_batches(cfg: ml_collections.ConfigDict) -> list[dict[str, np.ndarray]]:
    """The fixed held-out evaluation set: the first `cfg.train.eval_batches` held-out batches."""
    it = make_batches(cfg, "heldout")
    return [next(it) for _ in range(cfg.train.eval_batches)]


def corpus_stats(cfg: ml_collections.ConfigDict) -> dict[str, int]:
    """Rows and real tokens per split (for logs)."""
    out = {}
    for split in sources.SPLITS:
        r = packed_rows(cfg, split)
        out[f"{split}_rows"] = int(r["tokens"].shape[0])
        out[f"{split}_tokens"] = int((r["segment_ids"] > 0).sum())
    return out
