"""HF `DeepseekV3Config` <-> horizon model config (`docs/SPEC.md §1.5`).

Field mapping (HF name <-> horizon ``model.*`` name)::

    hidden_size              <-> d_model             num_hidden_layers      <-> num_layers
    num_attention_heads      <-> num_heads           vocab_size             <-> vocab_size
    intermediate_size        <-> mlp_dim             moe_intermediate_size  <-> moe_mlp_dim
    n_routed_experts         <-> num_experts         n_shared_experts       <-> num_shared_experts
    num_experts_per_tok      <-> num_experts_per_tok n_group / topk_group   <-> n_group / topk_group (None -> 1)
    first_k_dense_replace    <-> first_k_dense       q_lora_rank (None)     <-> q_lora_rank (0)
    kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, routed_scaling_factor,
    norm_topk_prob, rms_norm_eps                     <-> same names
    max_position_embeddings  <-> max_seq_len         tie_word_embeddings    <-> tie_embeddings
    num_nextn_predict_layers <-> mtp_depth           (alias num_mtp_layers)
    rope_parameters{rope_type, rope_theta, factor, original_max_position_embeddings, beta_fast,
        beta_slow, mscale, mscale_all_dim}       <-> rope_theta, rope_scaling{type ("default"<->"none"), ...}
        (the legacy `rope_scaling` + top-level `rope_theta` form of the original DeepSeek-V3 /
        Kimi-K2 config.json is read too; absent mscale/mscale_all_dim -> 0 = HF's "not given")

Fields with no HF counterpart (init_std, dtypes, router_bias_update_rate, moe_precision, ...) come
from `base` (default: the model section of configs/tiny.py). Unsupported HF settings raise (scoring_func
other than sigmoid, topk_method other than noaux_tc, moe_layer_freq != 1, attention_bias, hidden_act
other than silu, rope types other than default/yarn, explicit yarn attention_factor, truncate=False).
HF's `rope_interleave` is always True for this layout (see docs/ARCHITECTURE.md): our RoPE rotates
interleaved pairs, HF writes them de-interleaved; scores are identical.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import ml_collections

from horizon.utils.config import load_config_file

# (HF name, horizon name) for fields copied as-is.
_SAME_FIELDS = (
    ("vocab_size", "vocab_size"),
    ("hidden_size", "d_model"),
    ("num_hidden_layers", "num_layers"),
    ("num_attention_heads", "num_heads"),
    ("intermediate_size", "mlp_dim"),
    ("moe_intermediate_size", "moe_mlp_dim"),
    ("n_routed_experts", "num_experts"),
    ("n_shared_experts", "num_shared_experts"),
    ("num_experts_per_tok", "num_experts_per_tok"),
    ("first_k_dense_replace", "first_k_dense"),
    ("kv_lora_rank", "kv_lora_rank"),
    ("qk_nope_head_dim", "qk_nope_head_dim"),
    ("qk_rope_head_dim", "qk_rope_head_dim"),
    ("v_head_dim", "v_head_dim"),
    ("routed_scaling_factor", "routed_scaling_factor"),
    ("norm_topk_prob", "norm_topk_prob"),
    ("rms_norm_eps", "rms_norm_eps"),
    ("max_position_embeddings", "max_seq_len"),
    ("tie_word_embeddings", "tie_embeddings"),
    ("num_nextn_predict_layers", "mtp_depth"),
)
_INT_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
               "moe_intermediate_size", "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
               "first_k_dense_replace", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
               "max_position_embeddings", "num_nextn_predict_layers")
_YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")
# HF settings horizon's model implements only one way: {field: accepted values}
_SUPPORTED = {"hidden_act": ("silu",), "scoring_func": ("sigmoid",), "topk_method": ("noaux_tc",),
              "attention_bias": (False,), "moe_layer_freq": (1,), "rope_interleave": (True,)}
# HF defaults of optional fields (DeepseekV3Config may omit them)
_HF_DEFAULTS = {"n_shared_experts": 0, "first_k_dense_replace": 0, "norm_topk_prob": True,
                "tie_word_embeddings": False, "num_nextn_predict_layers": 0, "routed_scaling_factor": 1.0,
                "n_routed_experts": 0}
# the repo root (src/horizon/model/hf/config.py -> 4 levels up), home of configs/tiny.py
_REPO_ROOT = pathlib.Path(__file__).resolve().parents[4]


def model_section(cfg) -> ml_collections.ConfigDict:
    """The `model` section of a full config; a model section is returned as is."""
    return cfg.model if "model" in cfg else cfg


def hf_config_from_model_config(cfg) -> dict[str, Any]:
    """`DeepseekV3Config(**kwargs)` keyword arguments for a horizon model config (`docs/SPEC.md §1.5`).

    The dict is JSON-serialisable; `export_hf_checkpoint` writes it (plus legacy keys) as config.json.
    """
    m = model_section(cfg)
    out: dict[str, Any] = {hf: m[ours] for hf, ours in _SAME_FIELDS}
    for k in _INT_FIELDS:
        out[k] = int(out[k])
    for k in ("routed_scaling_factor", "rms_norm_eps"):
        out[k] = float(out[k])
    if m.num_experts == 0:  # all-dense horizon model: no HF layer reaches first_k_dense_replace
        out["first_k_dense_replace"] = int(m.num_layers)
    out["norm_topk_prob"] = bool(out["norm_topk_prob"])
    out["tie_word_embeddings"] = bool(out["tie_word_embeddings"])
    out["q_lora_rank"] = int(m.q_lora_rank) if m.q_lora_rank > 0 else None
    out["n_group"] = int(m.n_group)
    out["topk_group"] = int(m.topk_group)
    out["num_key_value_heads"] = int(m.num_heads)  # MLA: every head has its own K/V from the latent
    out["hidden_act"] = "silu"
    out["attention_bias"] = False
    out["rope_interleave"] = True
    out["rope_parameters"] = _hf_rope_parameters(m)
    return out


def _hf_rope_parameters(m) -> dict[str, Any]:
    """HF ``rope_parameters`` of a horizon model section."""
    rtype = m.rope_scaling.type if "rope_scaling" in m else "none"
    rp: dict[str, Any] = {"rope_type": "default" if rtype == "none" else rtype, "rope_theta": float(m.rope_theta)}
    if rtype == "yarn":
        rs = m.rope_scaling
        rp.update({k: float(rs[k]) for k in _YARN_KEYS})
        rp["original_max_position_embeddings"] = int(rs.original_max_position_embeddings)
    elif rtype != "none":
        raise ValueError(f"rope_scaling.type {rtype!r} has no HF mapping (expected 'none' or 'yarn')")
    return rp


def default_base() -> ml_collections.ConfigDict:
    """The model section of configs/tiny.py: the fields an HF config does not set."""
    path = _REPO_ROOT / "configs" / "tiny.py"
    if not path.exists():
        raise FileNotFoundError(f"no base config given and {path} not found; pass base=<model ConfigDict>")
    return load_config_file(path).model


def model_config_from_hf(hf: dict[str, Any] | str | os.PathLike, base=None) -> ml_collections.ConfigDict:
    """horizon model config from an HF DeepseekV3 config dict (or a config.json path / checkpoint dir).

    Fields without an HF counterpart are taken from `base` (a model ConfigDict; default configs/tiny.py).
    """
    if not isinstance(hf, dict):
        hf = read_hf_config(hf)
    hf = dict(hf)
    if "num_nextn_predict_layers" not in hf and "num_mtp_layers" in hf:
        hf["num_nextn_predict_layers"] = hf["num_mtp_layers"]
    for k, ok in _SUPPORTED.items():
        if k in hf and hf[k] not in ok:
            raise ValueError(f"unsupported HF config {k}={hf[k]!r} (supported: {ok})")
    all_dense = (hf.get("first_k_dense_replace") or 0) >= hf.get("num_hidden_layers", 0)
    if hf.get("n_routed_experts") in (None, 0) and not all_dense:
        raise ValueError("HF config has MoE layers but no routed experts (n_routed_experts)")
    m = ml_collections.ConfigDict((base if base is not None else default_base()).to_dict())
    for hf_name, ours in _SAME_FIELDS:
        v = hf.get(hf_name)
        if v is None:
            if hf_name not in _HF_DEFAULTS:
                raise ValueError(f"HF config lacks required field {hf_name!r}")
            v = _HF_DEFAULTS[hf_name]
        m[ours] = type(m[ours])(v) if ours in m and not isinstance(m[ours], bool) else v
    if hf.get("n_routed_experts") in (None, 0):
        m.num_experts = 0
    m.q_lora_rank = int(hf.get("q_lora_rank") or 0)
    m.n_group = int(hf.get("n_group") or 1)
    m.topk_group = int(hf.get("topk_group") or 1)
    kvh = hf.get("num_key_value_heads")
    if kvh is not None and kvh != m.num_heads:
        raise ValueError(f"num_key_value_heads={kvh} != num_attention_heads={m.num_heads}: "
                         "not a DeepSeek-V3 MLA config")
    _set_rope(m, hf)
    return m


def _set_rope(m: ml_collections.ConfigDict, hf: dict[str, Any]) -> None:
    """`m.rope_theta` and `m.rope_scaling` from HF ``rope_parameters`` (or the legacy ``rope_scaling``)."""
    rp = hf.get("rope_parameters")
    if rp is None:  # legacy (original DeepSeek-V3 / Kimi-K2 config.json)
        rp = dict(hf.get("rope_scaling") or {})
        rp.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    rp = dict(rp)
    rtype = rp.get("rope_type", rp.get("type", "default"))
    m.rope_theta = float(rp.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rs = m.rope_scaling
    if rtype == "default":
        rs.type = "none"
    elif rtype == "yarn":
        if rp.get("attention_factor") is not None:
            raise ValueError("explicit yarn attention_factor is not supported (horizon derives it from mscale)")
        if rp.get("truncate", True) is not True:
            raise ValueError("yarn truncate=False is not supported")
        if "original_max_position_embeddings" not in rp:
            raise ValueError("yarn rope needs original_max_position_embeddings")
        rs.type = "yarn"
        rs.original_max_position_embeddings = int(rp["original_max_position_embeddings"])
        f = rp.get("factor")
        rs.factor = float(f) if f is not None else m.max_seq_len / rs.original_max_position_embeddings
        rs.beta_fast = float(rp.get("beta_fast") or 32.0)
        rs.beta_slow = float(rp.get("beta_slow") or 1.0)
        rs.mscale = float(rp.get("mscale") or 0.0)
        rs.mscale_all_dim = float(rp.get("mscale_all_dim") or 0.0)
    else:
        raise ValueError(f"unsupported rope type {rtype!r} (supported: default, yarn)")


def read_hf_config(path: str | os.PathLike) -> dict[str, Any]:
    """config.json of a checkpoint dir (or the path of a config.json / of a file next to one)."""
    p = pathlib.Path(path)
    cand = p if p.name == "config.json" else (p / "config.json" if p.is_dir() else p.with_name("config.json"))
    if not cand.exists():
        raise FileNotFoundError(f"no config.json at {cand}")
    return json.loads(cand.read_text())
