"""Pretraining stages from one config: short context, then long (docs/SPEC.md §1.4, §8).

A config without a ``stages`` section is one stage, the config itself (today's run, unchanged). With
one, `plan` derives two stage configs from the base config, each a pure function of it:

- ``short``: the base config, in ``<train.output_dir>/short``.
- ``long``: in ``<train.output_dir>/long``, with ``data.seq_len = stages.long.seq_len`` (L_long),
  ``model.max_seq_len = L_long``, ``data.batch_size`` and ``train.steps / lr / warmup_steps /
  eval_every / checkpoint_every`` from ``stages.long``, and the RoPE extension ``stages.long.rope``
  names: ``"yarn"`` sets ``model.rope_scaling`` to type yarn, ``factor = L_long / L_short``,
  ``original_max_position_embeddings = L_short`` (L_short = the base ``data.seq_len``), keeping the
  base config's beta_fast / beta_slow / mscale / mscale_all_dim; ``"none"`` keeps the base RoPE
  (plain extrapolation, the ablation). Passkey documents stay ``stages.long.passkey_len`` tokens
  long (0 = the short stage's length).

The long stage starts from the short stage's last checkpoint's params (`horizon.train.loop`'s
``init_params``) with a **fresh optimizer state**: zero Adam moments and its own warmup + cosine
schedule at ``stages.long.lr``. The moments estimated at the short length describe other gradients
(other tokens per step, other positions), the schedule is per stage anyway, and a warmup from zero
protects the params while the moments refill; each stage's checkpoints are then self-contained, so
a resume needs only the stage directories.
"""

from __future__ import annotations

import pathlib
from typing import NamedTuple

import ml_collections

from horizon.data import passkey
from horizon.data.tokenizer import tokenizer_from_config
from horizon.train import lm
from horizon.utils.config import ConfigError, need, need_choice, need_float, need_int

ROPE_EXTENSIONS = ("yarn", "none")
LONG_FIELDS = ("seq_len", "batch_size", "steps", "lr", "warmup_steps", "eval_every", "checkpoint_every", "rope",
               "passkey_len")


class Stage(NamedTuple):
    """One stage: its name, its complete config and the stage whose params it starts from ("" = none)."""

    name: str
    cfg: ml_collections.ConfigDict
    init_from: str


def has_stages(cfg: ml_collections.ConfigDict) -> bool:
    return "stages" in cfg


def _copy(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    return cfg.copy_and_resolve_references()


def stage_dir(cfg: ml_collections.ConfigDict, name: str) -> str:
    """Where stage `name` of the base config `cfg` runs."""
    return str(pathlib.Path(cfg.train.output_dir) / name)


def yarn_scaling(base: ml_collections.ConfigDict, short_len: int, long_len: int) -> ml_collections.ConfigDict:
    """`base` (a ``model.rope_scaling``) as YaRN from `short_len` to `long_len` (module docstring)."""
    rs = _copy(base)
    rs.type = "yarn"
    rs.factor = float(long_len) / float(short_len)
    rs.original_max_position_embeddings = int(short_len)
    return rs


def short_config(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    c = _copy(cfg)
    c.train.output_dir = stage_dir(cfg, "short")
    return c


def long_config(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The long stage's config (module docstring)."""
    s, c = cfg.stages.long, _copy(cfg)
    short_len, long_len = int(cfg.data.seq_len), int(s.seq_len)
    c.train.output_dir = stage_dir(cfg, "long")
    c.data.seq_len, c.data.batch_size, c.model.max_seq_len = long_len, int(s.batch_size), long_len
    for k in ("steps", "lr", "warmup_steps", "eval_every", "checkpoint_every"):
        c.train[k] = s[k]
    if s.rope == "yarn":
        c.model.rope_scaling = yarn_scaling(cfg.model.rope_scaling, short_len, long_len)
    if "passkey_len" in c.data:
        c.data.passkey_len = int(s.passkey_len) or int(cfg.data.passkey_len) or short_len
    return c


def plan(cfg: ml_collections.ConfigDict) -> list[Stage]:
    """The stages `cfg` runs, in order (module docstring)."""
    if not has_stages(cfg):
        return [Stage("main", cfg, "")]
    return [Stage("short", short_config(cfg), ""), Stage("long", long_config(cfg), "short")]


def validate_stage_fields(cfg: ml_collections.ConfigDict) -> None:
    """``stages.long``'s own fields (names as the config spells them)."""
    s, p = cfg.stages.long, "stages.long"
    missing = [k for k in LONG_FIELDS if k not in s]
    need(not missing, p, sorted(s.keys()), f"needs the fields {LONG_FIELDS} (missing {missing})")
    n = need_int(s, "seq_len", p, lo=2)
    need(n > int(cfg.data.seq_len), f"{p}.seq_len", n, f"must be > data.seq_len={cfg.data.seq_len} (the short stage)")
    need_int(s, "batch_size", p, lo=1)
    steps = need_int(s, "steps", p, lo=1)
    need_float(s, "lr", p, 0.0, lo_open=True)
    w = need_int(s, "warmup_steps", p, lo=0)
    need(w < steps, f"{p}.warmup_steps", w, f"must be < {p}.steps={steps}")
    need_int(s, "eval_every", p, lo=1)
    need_int(s, "checkpoint_every", p, lo=1)
    need_choice(s, "rope", p, ROPE_EXTENSIONS)
    need_int(s, "passkey_len", p, lo=0)


def validate_pretrain_config(cfg: ml_collections.ConfigDict) -> None:
    """experiments/pretrain.py's config: `lm.validate_train_config` and the passkey fields of every
    stage, and the ``stages`` section; `ConfigError` (one line) before any work."""
    lm.validate_train_config(cfg)
    tok = tokenizer_from_config(cfg)
    passkey.validate_passkey_config(cfg.data, tok)
    if not has_stages(cfg):
        return
    validate_stage_fields(cfg)
    long = long_config(cfg)
    try:
        lm.validate_train_config(long)
        passkey.validate_passkey_config(long.data, tok)
    except ConfigError as e:
        raise ConfigError(f"long stage (derived from stages.long): {e}") from None
