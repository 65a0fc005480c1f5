"""Synthetic passkey documents: a random number stated once in filler text and asked for at the end
(docs/SPEC.md §1.4, §8).

A document is ``BOS filler... The pass key is 71432. filler... What is the pass key? The pass key is
71432. EOS``: filler sentences cycled from `FILLER` (starting at a random one, the first cut from
the front so the document is exactly `length` tokens), the key sentence at a random sentence
boundary (its depth), the question, then the answer. Every part is encoded on its own, so the
answer's token span is known exactly for any tokenizer (`PasskeyDoc.answer`). Everything is a pure
function of ``(stream, seed, index)``: training documents (`TRAIN_STREAM`, mixed in by
`horizon.data.pipeline`) and evaluation documents (`EVAL_STREAM`, `horizon.eval.long_context`) come
from different streams of the same generator.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
from jaxtyping import Float, Int

from horizon.utils.config import need, need_float, need_int

FILLER = ("The grass is green. ", "The sky is blue. ", "The sun is yellow. ", "Here we go. ",
          "There and back again. ")
KEY_SENTENCE = "The pass key is {key}. "
QUESTION = "What is the pass key? The pass key is "
TRAIN_STREAM, EVAL_STREAM = 0, 1
LOSSES = ("all", "answer")
PATTERN = re.compile(r"The pass key is (\d+)\. .*What is the pass key\? The pass key is (\d+)\.", re.S)


@dataclasses.dataclass(frozen=True)
class PasskeyDoc:
    """One document: its tokens, the key, where the key is stated and where its answer lies."""

    tokens: Int[np.ndarray, " n"]
    key: str
    key_start: int      # token index of the stated key sentence (its depth)
    answer_start: int   # token index of the answer's first token (the key, after the question)
    answer_len: int

    @property
    def answer(self) -> slice:
        return slice(self.answer_start, self.answer_start + self.answer_len)

    def loss_mask(self, loss: str = "all", answer_weight: float = 1.0) -> Float[np.ndarray, " n"]:
        """Target weights: every token (``"all"``) or only the answer (``"answer"``: no loss on the
        filler, nor on the stated key, whose digits are noise until it is read back); the answer's
        tokens weigh `answer_weight` (the loss is a weighted mean over targets)."""
        if loss not in LOSSES:
            raise ValueError(f"passkey loss must be one of {LOSSES}, got {loss!r}")
        m = np.ones(len(self.tokens), np.float32) if loss == "all" else np.zeros(len(self.tokens), np.float32)
        m[self.answer] = answer_weight
        return m

    @property
    def depth(self) -> float:
        """Where the key is stated, as a fraction of the document (0 = first, 1 = last)."""
        return self.key_start / max(len(self.tokens), 1)


def min_length(tok, digits: int) -> int:
    """Tokens of a document without filler (BOS, key sentence, question, answer, EOS) for a key of
    `digits` nines (a key's token count may differ by a few under BPE)."""
    key = "9" * digits
    n = len(tok.encode(KEY_SENTENCE.format(key=key))) + len(tok.encode(QUESTION)) + len(tok.encode(key))
    return n + len(tok.encode(".")) + (tok.bos_id is not None) + (tok.eos_id is not None)


def passkey_document(tok, length: int, *, seed: int, index: int, stream: int = TRAIN_STREAM,
                     digits: int = 5) -> PasskeyDoc:
    """Document `index` of `(stream, seed)`, exactly `length` tokens (module docstring); `ValueError`
    when `length` cannot hold the parts that are not filler (`min_length`)."""
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    rng = np.random.default_rng([stream, seed, index])
    key = str(int(rng.integers(10 ** (digits - 1), 10 ** digits)))
    key_ids, question, answer, end = (tok.encode(KEY_SENTENCE.format(key=key)), tok.encode(QUESTION),
                                      tok.encode(key), tok.encode("."))
    bos, eos = [tok.bos_id] if tok.bos_id is not None else [], [tok.eos_id] if tok.eos_id is not None else []
    budget = length - len(bos + key_ids + question + answer + end + eos)
    if budget < 0:
        raise ValueError(f"a passkey document needs >= {length - budget} tokens, got length {length}")
    units, used, i = [], 0, int(rng.integers(len(FILLER)))
    while used < budget:                              # whole sentences, the first cut from the front
        u = tok.encode(FILLER[i % len(FILLER)])
        units.append(u)
        used, i = used + len(u), i + 1
    excess = used - budget                            # cut from the front: whole sentences first
    while units and excess >= len(units[0]):
        excess -= len(units.pop(0))
    if excess:
        units[0] = units[0][excess:]
    at = int(rng.integers(1 if excess else 0, len(units) + 1))  # never inside the cut sentence
    head = bos + [t for u in units[:at] for t in u]
    body = head + key_ids + [t for u in units[at:] for t in u] + question
    ids = body + answer + end + eos
    return PasskeyDoc(np.asarray(ids, np.int32), key, len(head), len(body), len(answer))


def passkey_documents(tok, length: int, n: int, *, seed: int, stream: int = TRAIN_STREAM, start: int = 0,
                      digits: int = 5) -> list[PasskeyDoc]:
    """Documents `start .. start + n - 1` of `(stream, seed)`."""
    return [passkey_document(tok, length, seed=seed, index=start + i, stream=stream, digits=digits)
            for i in range(n)]


def parse(text: str) -> tuple[str, str] | None:
    """(stated key, answered key) of a decoded passkey document; None if `text` is not one."""
    m = PATTERN.search(text)
    return (m.group(1), m.group(2)) if m else None


def mix_count(n_docs: int, fraction: float) -> int:
    """How many passkey documents make them `fraction` of `n_docs` + themselves (0 <= fraction < 1)."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"passkey fraction must be in [0, 1), got {fraction}")
    return int(round(n_docs * fraction / (1.0 - fraction)))


def validate_passkey_config(d, tok) -> None:
    """`data.passkey_*` (configs/tiny.py) with tokenizer `tok`:
    `ConfigError` naming the field, before any work; a config without them mixes in nothing."""
    if "passkey_fraction" not in d:
        return
    f = need_float(d, "passkey_fraction", "data", 0.0, 1.0)
    need(f < 1.0, "data.passkey_fraction", f, "must be < 1 (a fraction of the training documents)")
    digits = need_int(d, "passkey_digits", "data", lo=1, hi=18)
    need(d.get("passkey_loss", "all") in LOSSES, "data.passkey_loss", d.get("passkey_loss"), f"must be one of {LOSSES}")
    if "passkey_answer_weight" in d:
        need_float(d, "passkey_answer_weight", "data", 0.0, lo_open=True)
    n = need_int(d, "passkey_len", "data", lo=0) or int(d.seq_len)
    need(n <= int(d.seq_len), "data.passkey_len", d.passkey_len, f"must be <= data.seq_len={d.seq_len} (0 = it)")
    if f > 0:
        lo = min_length(tok, digits) + 2
        need(n >= lo, "data.passkey_len" if d.passkey_len else "data.seq_len", n,
             f"a passkey document of {digits} digits needs >= {lo} tokens")
