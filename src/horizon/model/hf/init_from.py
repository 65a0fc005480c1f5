"""`model.init_from`: a run's model section and tokenizer derived from an HF checkpoint directory."""

from __future__ import annotations

import pathlib
import warnings

from horizon.data.tokenizer import add_chat_specials, load_tokenizer, resolve_tokenizer_file
from horizon.model.hf.config import model_config_from_hf, read_hf_config
from horizon.utils.config import ConfigError

CHAT_TOKENIZER_FILE = "tokenizer.horizon.json"   # a checkpoint tokenizer with horizon's chat specials added


def apply_init_from(c) -> None:
    """Derive the model section of a run that starts from an HF checkpoint directory
    (`model.init_from`; `horizon.utils.cli.load`'s `derive` hook, before validation):
    the architecture fields come from its config.json (the others, e.g. `max_seq_len`, stay the
    config's), and when the config names no tokenizer ("byte") and the directory holds a
    `tokenizer.json`, `model.tokenizer` becomes it. A tokenizer without horizon's chat specials and
    without a chat template gets them added (written beside it as `CHAT_TOKENIZER_FILE`) and
    `model.vocab_size` grows to cover them: `pretrained_params` initialises the new embedding and
    LM-head rows. Raises `ConfigError` (one line) for a directory without config.json."""
    m = c.model
    src = str(m.get("init_from", "") or "")
    if not src:
        return
    d = pathlib.Path(src)
    if not (d / "config.json").is_file():
        raise ConfigError(f"model.init_from={src!r}: no config.json there (an HF checkpoint directory)")
    try:
        m.update(model_config_from_hf(read_hf_config(d), base=m).to_dict())
    except ValueError as e:
        raise ConfigError(f"model.init_from={src!r}: {e}") from None
    if str(m.get("tokenizer", "byte")) == "byte" and (d / "tokenizer.json").is_file():
        m.tokenizer = str(d)
    spec = str(m.get("tokenizer", "byte"))
    if spec == "byte":
        return
    try:
        load_tokenizer(spec)
    except ValueError as e:
        if "lacks horizon's chat special tokens" not in str(e):
            raise ConfigError(f"model.tokenizer={spec!r}: {e}") from None
        m.tokenizer = str(_add_chat_specials(spec))
    m.vocab_size = max(int(m.vocab_size), int(load_tokenizer(str(m.tokenizer)).vocab_size))


def _add_chat_specials(spec: str) -> pathlib.Path:
    """Copy of tokenizer `spec` with horizon's chat specials added, written beside it; warns."""
    f = resolve_tokenizer_file(spec)
    out = f.parent / CHAT_TOKENIZER_FILE
    added = add_chat_specials(f, out)
    warnings.warn(f"{f}: added horizon's chat special tokens {added} -> {out}; their embedding and LM-head "
                  "rows are initialised fresh (hf.pretrained_params)", stacklevel=3)
    return out
