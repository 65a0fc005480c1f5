"""Tokenizers: the one interface every module uses for ids, specials and the chat format (docs/SPEC.md §5, §8).

No module outside this one names a token id: the sampler's pad and stop ids, the agent prompt's
role markers, the batch builder's pad, SFT demos and scripted policies all come from a `Tokenizer`:

* `encode(text, bos=, eos=)` / `decode(ids)` (specials dropped, never raises), `vocab_size`;
* `pad_id`, `bos_id`, `eos_id`, `end_turn_id` (the token a turn ends with: the model emits it and
  is trained on it), `stop_ids` (generation stops after either of end-of-turn / EOS);
* the chat format as token pieces: `context_start()` (ids a context opens with), `turn_open(role)`
  (ids before a message's text; the bare assistant opening is the generation prompt) and
  `turn_close(role)` (``[end_turn_id]`` plus any separator after it); roles are
  `ROLES` = system / user / assistant / observation (a tool result; "tool" in HF templates).
  `horizon.agent.prompt.render` lays messages out with exactly these pieces;

Implementations:
* `ByteTokenizer` (default for the tiny configs): ids 0..255 are UTF-8 bytes, eight specials
  follow; a turn is ``ROLE text END_TURN``. Byte-level keeps tiny configs self-contained and lets
  a small model emit any tool-call text.
* `BPETokenizer`: a Hugging Face `tokenizers` file (`tokenizer.json`) with horizon's chat specials
  (`CHAT_SPECIALS`: the same layout as the byte tokenizer's) or, for a model's own format, the
  chat template of its `tokenizer_config.json` (Jinja; the turn pieces are cut out of the template's
  rendering of sentinel messages, so horizon's rendering equals `apply_chat_template`'s).

`tokenizer_from_config(c)` builds the run's tokenizer from `model.tokenizer` ("byte", a
`tokenizer.json`, or a directory holding one).
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from horizon.utils.config import ConfigError

NUM_BYTES = 256
ROLES = ("system", "user", "assistant", "observation")
# horizon's chat specials (name -> meaning), in id order after a BPE vocabulary's regular tokens
CHAT_SPECIALS = {"pad": "<|pad|>", "bos": "<|bos|>", "eos": "<|eos|>", "system": "<|system|>",
                 "user": "<|user|>", "assistant": "<|assistant|>", "observation": "<|observation|>",
                 "end_turn": "<|end|>"}
HF_ROLE = {"system": "system", "user": "user", "assistant": "assistant", "observation": "tool"}
_SENTINEL = "\x00HORIZON_SENTINEL\x00"


@runtime_checkable
class Tokenizer(Protocol):
    vocab_size: int
    pad_id: int
    bos_id: int | None
    eos_id: int
    end_turn_id: int

    @property
    def stop_ids(self) -> tuple[int, ...]: ...

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]: ...

    def decode(self, ids) -> str: ...

    def context_start(self) -> list[int]: ...

    def turn_open(self, role: str) -> list[int]: ...

    def turn_close(self, role: str) -> list[int]: ...


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")


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

    pad_id = property(lambda self: self.PAD)
    bos_id = property(lambda self: self.BOS)
    eos_id = property(lambda self: self.EOS)
    end_turn_id = property(lambda self: self.END_TURN)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return (self.END_TURN, self.EOS)

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

    def _role_ids(self) -> dict[str, int]:
        return {"system": self.SYSTEM, "user": self.USER, "assistant": self.ASSISTANT,
                "observation": self.OBSERVATION}

    def context_start(self) -> list[int]:
        return [self.BOS]

    def turn_open(self, role: str) -> list[int]:
        _check_role(role)
        return [self._role_ids()[role]]

    def turn_close(self, role: str) -> list[int]:
        _check_role(role)
        return [self.END_TURN]


class BPETokenizer:
    """A Hugging Face `tokenizers` tokenizer (`tokenizer.json`) behind the `Tokenizer` interface.

    Chat format: horizon's specials (`CHAT_SPECIALS`, all present in the vocabulary; the byte
    tokenizer's layout ``<|role|> text <|end|>``) unless `chat_template` (a Jinja template, as in a
    model's `tokenizer_config.json`) is given, in which case each role's opening and closing pieces
    are cut out of the template's rendering of sentinel messages (`template_pieces`); the template's
    end-of-turn token is the first special token of the closing piece. Regular text never encodes
    to a special token (`encode` does not parse specials: ``"<|end|>"`` in text is text).
    """

    def __init__(self, path: str | os.PathLike, *, chat_template: str | None = None,
                 special_names: dict[str, str] | None = None):
        from tokenizers import Tokenizer as _HFTok  # noqa: PLC0415

        self.path = str(path)
        self._tok = _HFTok.from_file(self.path)
        # text never turns into a special token (an observation that prints "<|end|>" must not end a
        # turn); only the chat template's own pieces are parsed for specials (`template_pieces`)
        self._tok.encode_special_tokens = True
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        self.chat_template = chat_template
        names = dict(special_names or {})
        if chat_template is None:
            names = {**CHAT_SPECIALS, **names}
            missing = [t for t in names.values() if self._tok.token_to_id(t) is None]
            if missing:
                raise ValueError(f"{self.path}: tokenizer lacks horizon's chat special tokens {missing} "
                                 "(add them: horizon.data.tokenizer.add_chat_specials, or give a chat_template)")
            sid = {k: int(self._tok.token_to_id(t)) for k, t in names.items()}
            self._open = {r: [sid[r]] for r in ROLES}
            self._close = {r: [sid["end_turn"]] for r in ROLES}
            self._start = [sid["bos"]]
            self.pad_id, self.bos_id, self.eos_id, self.end_turn_id = (sid["pad"], sid["bos"], sid["eos"],
                                                                        sid["end_turn"])
        else:
            self._start, self._open, self._close = template_pieces(chat_template, self, names)
            self.end_turn_id = self._first_special(self._close["assistant"], "the assistant turn's closing piece")
            self.eos_id = self._named(names, "eos", self.end_turn_id)
            self.bos_id = self._named(names, "bos", None)
            self.pad_id = self._named(names, "pad", self.eos_id)

    # -- helpers ---------------------------------------------------------------------------
    def _special_id_set(self) -> set[int]:
        return {int(self._tok.token_to_id(t.content)) for t in self._tok.get_added_tokens_decoder().values()
                if t.special}

    def _first_special(self, ids: Sequence[int], what: str) -> int:
        sp = self._special_id_set()
        for i in ids:
            if i in sp:
                return int(i)
        raise ValueError(f"{self.path}: no special token in {what} ({self.decode_raw(ids)!r})")

    def _named(self, names: dict, key: str, default):
        if key not in names:
            return default
        i = self._tok.token_to_id(names[key])
        if i is None:
            raise ValueError(f"{self.path}: special token {names[key]!r} ({key}) not in the vocabulary")
        return int(i)

    def decode_raw(self, ids) -> str:
        return self._tok.decode([int(i) for i in np.asarray(ids).reshape(-1)], skip_special_tokens=False)

    # -- Tokenizer interface ---------------------------------------------------------------
    @property
    def stop_ids(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys((self.end_turn_id, self.eos_id)))

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids if text else []
        start = ([self.bos_id] if bos and self.bos_id is not None else [])
        return start + list(ids) + ([self.eos_id] if eos else [])

    def decode(self, ids) -> str:
        arr = [int(i) for i in np.asarray(ids, dtype=np.int64).reshape(-1) if 0 <= int(i) < self.vocab_size]
        return self._tok.decode(arr, skip_special_tokens=True)

    def context_start(self) -> list[int]:
        return list(self._start)

    def turn_open(self, role: str) -> list[int]:
        _check_role(role)
        return list(self._open[role])

    def turn_close(self, role: str) -> list[int]:
        _check_role(role)
        return list(self._close[role])


def template_pieces(template: str, tok: BPETokenizer, names: dict[str, str]
                    ) -> tuple[list[int], dict[str, list[int]], dict[str, list[int]]]:
    """(context start, opening ids per role, closing ids per role) of a Jinja chat template: the
    template renders [system, user, assistant, tool] sentinel messages; the text between one
    message's sentinel and the next's is that message's closing piece plus the next's opening piece,
    split where the next message's opening begins (found by rendering a prefix of the list). The
    context start is empty: horizon contexts open with a system message, whose opening carries
    whatever the template puts first (e.g. a BOS). The generation prompt
    (``add_generation_prompt=True``) must equal the assistant opening."""
    import jinja2  # noqa: PLC0415  (a transformers dependency; only chat templates need it)

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    tmpl = env.from_string(template)
    kw = {k: v for k, v in (("bos_token", names.get("bos", "")), ("eos_token", names.get("eos", "")))}

    def render(msgs, gen=False) -> str:
        return tmpl.render(messages=msgs, add_generation_prompt=gen, **kw)

    order = ["system", "user", "assistant", "observation"]
    msgs = [{"role": HF_ROLE[r], "content": f"{_SENTINEL}{i}{_SENTINEL}"} for i, r in enumerate(order)]
    full = render(msgs)
    opens, closes = {}, {}
    prev_end = 0
    for i, r in enumerate(order):
        marker = f"{_SENTINEL}{i}{_SENTINEL}"
        at = full.index(marker)
        before = render(msgs[:i]) if i else ""
        if not full.startswith(before):
            raise ValueError("chat template: rendering a prefix of the messages is not a prefix of the whole")
        if i == 0:      # horizon contexts open with a system message: whatever precedes it (a BOS) is its opening
            opens[r] = full[:at]
        else:
            closes[order[i - 1]] = full[prev_end:len(before)]
            opens[r] = full[len(before):at]
        prev_end = at + len(marker)
    closes[order[-1]] = full[prev_end:]
    gen = render(msgs[:2], gen=True)[len(render(msgs[:2])):]
    if gen != opens["assistant"]:
        raise ValueError(f"chat template: generation prompt {gen!r} differs from the assistant opening "
                         f"{opens['assistant']!r}")

    def ids(text: str) -> list[int]:
        if not text:
            return []
        tok._tok.encode_special_tokens = False
        try:
            return list(tok._tok.encode(text, add_special_tokens=False).ids)
        finally:
            tok._tok.encode_special_tokens = True

    return [], {r: ids(t) for r, t in opens.items()}, {r: ids(t) for r, t in closes.items()}


def add_chat_specials(path_in: str | os.PathLike, path_out: str | os.PathLike) -> list[str]:
    """Write `path_in`'s tokenizer with any of `CHAT_SPECIALS` it lacks added (as special tokens, ids
    after its vocabulary: a model using it needs those embedding rows, `horizon.model.hf.pretrained_params`).
    Returns the added tokens."""
    from tokenizers import AddedToken  # noqa: PLC0415
    from tokenizers import Tokenizer as _HFTok  # noqa: PLC0415 - only for tokenizer.json files

    t = _HFTok.from_file(str(path_in))
    missing = [s for s in CHAT_SPECIALS.values() if t.token_to_id(s) is None]
    t.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in missing])
    t.save(str(path_out))
    return missing


def resolve_tokenizer_file(spec: str | os.PathLike) -> pathlib.Path:
    """`spec` as a tokenizer.json path (a directory means its tokenizer.json)."""
    p = pathlib.Path(spec)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise FileNotFoundError(f"model.tokenizer={str(spec)!r}: no tokenizer.json there")
    return p


@functools.lru_cache(maxsize=16)
def load_tokenizer(spec: str, vocab_size: int | None = None) -> Tokenizer:
    """"byte" -> `ByteTokenizer(vocab_size)`; a tokenizer.json or a directory with one (and, if
    present, `tokenizer_config.json` with a `chat_template`) -> `BPETokenizer`."""
    if spec == "byte":
        return ByteTokenizer(int(vocab_size)) if vocab_size else ByteTokenizer()
    path = resolve_tokenizer_file(spec)
    template, names = None, {}
    conf = path.parent / "tokenizer_config.json"
    if conf.is_file():
        tc = json.loads(conf.read_text())
        template = tc.get("chat_template")
        for k in ("bos", "eos", "pad"):
            v = tc.get(f"{k}_token")
            if isinstance(v, dict):
                v = v.get("content")
            if v:
                names[k] = v
    if template is None:
        names = {}          # horizon's own specials decide (a tokenizer_config's names are for its template)
    tok = BPETokenizer(path, chat_template=template, special_names=names)
    if vocab_size is not None and tok.vocab_size > int(vocab_size):
        raise ValueError(f"model.tokenizer={spec!r} has {tok.vocab_size} ids but model.vocab_size={vocab_size}")
    return tok


def validate_tokenizer(m) -> None:
    """`model.tokenizer` (a model config section) loads and fits `model.vocab_size`: raises
    `ConfigError` naming the field (drivers call it before any expensive work)."""
    spec = str(m.get("tokenizer", "byte"))
    try:
        load_tokenizer(spec, int(m.vocab_size))
    except (ValueError, FileNotFoundError, OSError) as e:
        raise ConfigError(f"model.tokenizer={spec!r}: {' '.join(str(e).split())}") from None


def tokenizer_from_config(c) -> Tokenizer:
    """The run's tokenizer: `model.tokenizer` ("byte" by default) checked against `model.vocab_size`."""
    m = c.model if "model" in c else c
    return load_tokenizer(str(m.get("tokenizer", "byte")), int(m.vocab_size))


def train_bpe(texts, vocab_size: int, *, min_frequency: int = 2):
    """A byte-level BPE (`tokenizers`) of `vocab_size` ids trained on `texts` (an iterable of
    strings), with horizon's `CHAT_SPECIALS` as its first ids: every string encodes (byte-level
    fallback, no unknown token) and decodes back exactly. Returns the `tokenizers.Tokenizer`."""
    from tokenizers import Tokenizer as _HFTok  # noqa: PLC0415
    from tokenizers import decoders, models, pre_tokenizers, trainers  # noqa: PLC0415

    specials = list(CHAT_SPECIALS.values())
    if vocab_size < NUM_BYTES + len(specials):
        raise ValueError(f"vocab_size must be >= {NUM_BYTES + len(specials)} (bytes + chat specials), got {vocab_size}")
    tok = _HFTok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=int(vocab_size), min_frequency=int(min_frequency), special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok
