"""Greedy sequence packing into fixed-length rows (docs/SPEC.md §8; reused for RL batches, docs/SPEC.md §4).

A packed row holds several sequences back to back. `segment_ids` number the sequences
in a row 1..n (0 = padding) so attention can be made block-diagonal and the loss can
drop targets that cross a boundary; `positions` restart at 0 for every segment so
RoPE sees each sequence as if it were alone.

Everything here is pure numpy (no JAX): it runs in the data pipeline and in the RL
batch builder on the host.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from jaxtyping import Float, Int


@dataclass(frozen=True)
class PackedRows:
    """Result of `pack_sequences`.

    `placement[i] = (row, start)` says where input sequence i landed, so per-sequence
    outputs (e.g. RL logprobs) can be unpacked again with `unpack`.
    `extras[name]` are per-token side arrays packed the same way (pad value 0).
    """

    tokens: Int[np.ndarray, "rows seq"]
    segment_ids: Int[np.ndarray, "rows seq"]
    positions: Int[np.ndarray, "rows seq"]
    placement: Int[np.ndarray, "n 2"]
    lengths: Int[np.ndarray, " n"]
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return int(self.tokens.shape[0])


def first_fit(lengths: Sequence[int], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Greedy first-fit bin assignment in input order: each sequence goes to the first
    row with room for it, else opens a new row. Returns (row, start) per sequence and
    the number of tokens used per row."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.ndim != 1:
        raise ValueError(f"lengths must be 1-D, got shape {lengths.shape}")
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    if lengths.size and (lengths.min() <= 0 or lengths.max() > seq_len):
        raise ValueError(
            f"every sequence needs 1 <= length <= seq_len={seq_len}; got min {lengths.min()}, "
            f"max {lengths.max()} (chunk long sequences first, e.g. with `chunk`)")
    used = np.zeros(max(1, lengths.size), dtype=np.int64)  # at most one row per sequence
    num_rows = 0
    placement = np.zeros((lengths.size, 2), dtype=np.int64)
    for i, n in enumerate(lengths):
        fits = np.flatnonzero(used[:num_rows] + n <= seq_len)
        row = int(fits[0]) if fits.size else num_rows
        num_rows = max(num_rows, row + 1)
        placement[i] = (row, used[row])
        used[row] += n
    return placement, used[:num_rows]


def pack_sequences(
    seqs: Sequence[Sequence[int] | np.ndarray],
    seq_len: int,
    *,
    pad_id: int = 0,
    extras: Mapping[str, Sequence[np.ndarray]] | None = None,
    min_rows: int = 0,
) -> PackedRows:
    """Pack variable-length token sequences into rows of `seq_len` (greedy first-fit).

    Every token is kept exactly once; no sequence is split (sequences longer than
    `seq_len` raise: split them with `chunk` first). `extras` are per-token arrays
    aligned with `seqs` (same lengths), packed alongside (e.g. loss masks, logprobs).
    `min_rows` pads the output with empty rows (a fixed batch shape for jit).
    """
    arrays = [np.asarray(s).reshape(-1) for s in seqs]
    lengths = np.array([a.size for a in arrays], dtype=np.int64)
    placement, _ = first_fit(lengths, seq_len)
    num_rows = max(int(placement[:, 0].max()) + 1 if len(arrays) else 0, min_rows)
    tokens = np.full((num_rows, seq_len), pad_id, dtype=np.int32)
    segment_ids = np.zeros((num_rows, seq_len), dtype=np.int32)
    positions = np.zeros((num_rows, seq_len), dtype=np.int32)
    extras = dict(extras or {})
    out_extras = {}
    for name, vals in extras.items():
        if len(vals) != len(arrays):
            raise ValueError(f"extras[{name!r}] has {len(vals)} entries for {len(arrays)} sequences")
        first = np.asarray(vals[0]) if len(vals) else np.zeros(0, np.float32)
        out_extras[name] = np.zeros((num_rows, seq_len), dtype=first.dtype)
    next_seg = np.zeros(num_rows, dtype=np.int32)
    for i, (a, (row, start)) in enumerate(zip(arrays, placement)):
        n = a.size
        next_seg[row] += 1
        tokens[row, start:start + n] = a
        segment_ids[row, start:start + n] = next_seg[row]
        positions[row, start:start + n] = np.arange(n, dtype=np.int32)
        for name, vals in extras.items():
            v = np.asarray(vals[i]).reshape(-1)
            if v.size != n:
                raise ValueError(f"extras[{name!r}][{i}] has {v.size} values for a {n}-token sequence")
            out_extras[name][row, start:start + n] = v
    return PackedRows(tokens, segment_ids, positions, placement.astype(np.int32),
                      lengths.astype(np.int32), out_extras)


def unpack(values: np.ndarray, packed: PackedRows) -> list[np.ndarray]:
    """Inverse of packing for a per-token array `values[rows, seq]` (e.g. model logprobs)."""
    return [np.asarray(values[r, s:s + n]) for (r, s), n in zip(packed.placement, packed.lengths)]


def chunk(seq: np.ndarray, max_len: int) -> list[np.ndarray]:
    """Split a long sequence into consecutive pieces of at most `max_len` tokens."""
    seq = np.asarray(seq).reshape(-1)
    if max_len <= 0:
        raise ValueError(f"max_len must be positive, got {max_len}")
    return [seq[i:i + max_len] for i in range(0, seq.size, max_len)]


def target_mask(
    segment_ids: Int[np.ndarray, "rows seq"], mask: Float[np.ndarray, "rows seq"] | None = None
) -> Float[np.ndarray, "rows seq_minus_1"]:
    """Weights for next-token targets `tokens[:, 1:]`: 1 where the target is a real,
    loss-bearing token in the same segment as its input (no cross-segment leakage)."""
    seg = np.asarray(segment_ids)
    same = (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] > 0)
    w = same.astype(np.float32)
    if mask is not None:
        w = w * np.asarray(mask, dtype=np.float32)[:, 1:]
    return w
