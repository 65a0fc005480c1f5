"""Pretraining stages from one config (docs/SPEC.md §1.4, §8): the long stage's derived fields (lengths,
steps, YaRN), a config without stages is one stage and itself, and bad stage fields fail in one line."""

import pathlib

import pytest

from horizon.eval import long_context
from horizon.train import stages
from horizon.utils.config import ConfigError, load_config_file

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture()
def cfg():
    return load_config_file(ROOT / "configs" / "pretrain_long.py")


def test_no_stages_is_the_config_itself():
    c = load_config_file(ROOT / "configs" / "tiny.py")
    (only,) = stages.plan(c)
    assert only.cfg is c and only.name == "main" and only.init_from == ""
    stages.validate_pretrain_config(c)
    long_context.validate_long_eval(c)                          # nothing asked of a single stage


def test_long_stage_is_derived_from_the_base(cfg):
    short, long = stages.plan(cfg)
    assert (short.name, long.name, long.init_from) == ("short", "long", "short")
    assert (short.cfg.train.output_dir, long.cfg.train.output_dir) == ("runs/pretrain_long/short",
                                                                       "runs/pretrain_long/long")
    assert short.cfg.to_dict() | {"train": None} == cfg.to_dict() | {"train": None}   # only the directory moves
    assert short.cfg.data.seq_len == 128 and long.cfg.data.seq_len == 2048 >= 16 * 128
    assert long.cfg.model.max_seq_len == 2048 and long.cfg.data.batch_size == cfg.stages.long.batch_size
    for k in ("steps", "lr", "warmup_steps", "eval_every", "checkpoint_every"):
        assert long.cfg.train[k] == cfg.stages.long[k]
    assert long.cfg.train.min_lr_ratio == cfg.train.min_lr_ratio and long.cfg.seed == cfg.seed
    rs = long.cfg.model.rope_scaling
    assert (rs.type, rs.factor, rs.original_max_position_embeddings) == ("yarn", 16.0, 128)
    base = cfg.model.rope_scaling
    assert (rs.beta_fast, rs.beta_slow, rs.mscale, rs.mscale_all_dim) == (
        base.beta_fast, base.beta_slow, base.mscale, base.mscale_all_dim)
    assert base.type == "none" and short.cfg.model.rope_scaling.type == "none"   # the base is untouched
    assert long.cfg.data.passkey_len == 128                   # passkey documents stay at the short length
    cfg.stages.long.passkey_len = 512
    assert stages.long_config(cfg).data.passkey_len == 512
    cfg.stages.long.rope = "none"                             # the ablation: plain RoPE past 128
    assert stages.long_config(cfg).model.rope_scaling.to_dict() == base.to_dict()
    stages.validate_pretrain_config(cfg)
    long_context.validate_long_eval(cfg)


@pytest.mark.parametrize("field,value,message", [
    ("stages.long.seq_len", 128, r"stages\.long\.seq_len=128: must be > data\.seq_len=128"),
    ("stages.long.rope", "ntk", r"stages\.long\.rope='ntk': must be one of \('yarn', 'none'\)"),
    ("stages.long.warmup_steps", 10**6, r"stages\.long\.warmup_steps=1000000: must be < stages\.long\.steps=\d+"),
    ("stages.long.batch_size", 3, r"long stage \(derived from stages\.long\): data\.batch_size=3"),
    ("long_eval.multiples", (1, 4, 32), r"long_eval\.multiples=\(1, 4, 32\): the longest length"),
    ("long_eval.multiples", (4, 1), r"long_eval\.multiples=\(4, 1\): must be increasing"),
    ("data.passkey_fraction", 1.0, r"data\.passkey_fraction=1\.0"),
])
def test_bad_stage_fields_fail_in_one_line(cfg, field, value, message):
    sec, _, name = field.rpartition(".")
    node = cfg
    for part in sec.split("."):
        node = node[part]
    node[name] = value
    if field == "stages.long.batch_size":
        cfg.mesh.data = 2                                     # 3 rows do not split over 2 ranks
        cfg.data.batch_size = 32
    with pytest.raises(ConfigError, match=message) as e:
        stages.validate_pretrain_config(cfg)
        long_context.validate_long_eval(cfg)
    assert "\n" not in str(e.value)
