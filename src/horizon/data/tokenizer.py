"""Byte-level tokenizer (the default; SPEC §8) with a handful of special tokens.

Ids 0..255 are raw UTF-8 bytes; specials follow. Byte-level keeps the tiny configs
self-contained (no downloaded vocab) and lets a small model emit any tool-call text.
An optional Hugging Face tokenizer can be wrapped with `HFTokenizer` (same interface).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NUM_BYTES = 256


@dataclass(frozen=True)
class ByteTokenizer:
    """UTF-8 bytes + specials. `vocab_size` must cover `NUM_BYTES + len(SPECIALS)`."""

    vocab_size: int = 320

    PAD: int = 256
    BOS: int = 257
    EOS: int = 258
    # Chat-role markers used by the agent prompt format (horizon.agent).
    SYSTEM: int = 259
    USER: int = 260
    ASSISTANT: int = 261
    OBSERVATION: int = 262
    END_TURN: int = 263

    def __post_init__(self):
        if self.vocab_size < NUM_BYTES + 8:
            raise ValueError(f"ByteTokenizer needs vocab_size >= {NUM_BYTES + 8}, got {self.vocab_size}")

    @property
    def special_ids(self) -> tuple[int, ...]:
        return (self.PAD, self.BOS, self.EOS, self.SYSTEM, self.USER, self.ASSISTANT,
                self.OBSERVATION, self.END_TURN)

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return ([self.BOS] if bos else []) + ids + ([self.EOS] if eos else [])

    def decode(self, ids) -> str:
        """Decode ids, dropping specials and ids outside the byte range (never raises)."""
        arr = np.asarray(ids, dtype=np.int64).reshape(-1)
        data = bytes(int(i) for i in arr if 0 <= i < NUM_BYTES)
        return data.decode("utf-8", errors="replace")


class HFTokenizer:
    """Thin wrapper over a local `transformers` tokenizer (optional dependency)."""

    def __init__(self, name_or_path: str):
        from transformers import AutoTokenizer  # optional

        self._tok = AutoTokenizer.from_pretrained(name_or_path)
        self.vocab_size = len(self._tok)
        self.PAD = self._tok.pad_token_id if self._tok.pad_token_id is not None else 0
        self.BOS = self._tok.bos_token_id
        self.EOS = self._tok.eos_token_id

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False)
        return ([self.BOS] if bos else []) + ids + ([self.EOS] if eos else [])

    def decode(self, ids) -> str:
        return self._tok.decode(list(np.asarray(ids).reshape(-1)), skip_special_tokens=True)
