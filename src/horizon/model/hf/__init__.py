"""DeepSeek-V3 / Kimi-K2 Hugging Face checkpoints <-> horizon params (SPEC §1 "Checkpoint import").

Torch-free: safetensors files are read with a small header parser over `np.memmap` (one tensor at a
time, any dtype ml_dtypes knows: F32/F16/BF16/F8_E4M3/...; safetensors' own numpy backend cannot
return float8, see `CheckpointReader`) and written with the matching writer, so a checkpoint streams
through host memory tensor by tensor.

Entry point for drivers: `load_pretrained(dir)` -> (model config, params) from a directory as
`transformers`' ``save_pretrained`` writes it (config.json + ``*.safetensors``, sharded with a
``model.safetensors.index.json`` or not) or as `export_hf_checkpoint` writes it.

Config mapping (`hf_config_from_model_config` / `model_config_from_hf`; HF = `DeepseekV3Config`)::

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
from `base` (default: configs/tiny.py `model_config()`). Unsupported HF settings raise (scoring_func
other than sigmoid, topk_method other than noaux_tc, moe_layer_freq != 1, attention_bias, hidden_act
other than silu, rope types other than default/yarn, explicit yarn attention_factor, truncate=False).
HF's `rope_interleave` is always True for this layout (see docs/ARCHITECTURE.md): our RoPE rotates
interleaved pairs, HF writes them de-interleaved; scores are identical.

Tensor mapping (HF `nn.Linear` weights are ``[out, in]``; ours are ``[in, out]``, so every Linear is
transposed). Layer ``i < first_k_dense`` goes to ``params["dense"][..][i]``, the others to
``params["moe"][..][i - first_k_dense]``::

    model.embed_tokens.weight [V,D]                  -> embed [V,D]         (no transpose)
    model.norm.weight                                -> final_norm
    lm_head.weight [V,D]                             -> lm_head [D,V]       (absent if tied)
    model.layers.{i}.input_layernorm / post_attention_layernorm -> attn_norm / mlp_norm
      self_attn.q_a_proj / q_a_layernorm / q_b_proj  -> attn.wq_a / q_norm / wq_b   (q_lora_rank > 0)
      self_attn.q_proj                               -> attn.wq                     (q_lora_rank = 0)
      self_attn.kv_a_proj_with_mqa / kv_a_layernorm / kv_b_proj / o_proj
                                                     -> attn.wkv_a / kv_norm / wkv_b / wo
      mlp.{gate,up,down}_proj                        -> mlp.{gate,up,down}          (dense layers)
      mlp.gate.weight [E,D]                          -> moe.router [D,E]
      mlp.gate.e_score_correction_bias               -> moe.router_bias
      mlp.experts.{j}.{gate,up,down}_proj.weight     -> moe.experts.{gate,up,down}[j]  (on-disk layout)
      mlp.experts.gate_up_proj [E,2F,D], mlp.experts.down_proj [E,D,F]
                                                     -> same (the fused in-memory layout of
                                                        transformers>=5; read, never written)
      mlp.shared_experts.{gate,up,down}_proj         -> moe.shared.{gate,up,down}

MTP (DeepSeek-V3 stores its MTP module as the extra decoder layer ``model.layers.{L+k}``), loaded
into ``params["mtp"][..][k]`` only when ``mtp_depth > 0`` (otherwise those layers are skipped).
``transformers`` declares ``num_nextn_predict_layers`` (default 1) but builds and saves no MTP layer, so
a checkpoint may hold none of them: then the MTP subtree is initialised fresh
(``layers.materialize(PRNGKey(mtp_init_seed), transformer.mtp_spec(cfg))``, the repo's own init) with
one warning; the report trains MTP from scratch (issue 22). Some but not all MTP tensors present is a
corrupt checkpoint: a hard error naming the missing ones::

    model.layers.{L+k}.enorm / hnorm                 -> mtp.enorm / hnorm
    model.layers.{L+k}.eh_proj.weight [D,2D]         -> mtp.proj [2D,D]   (input = [enorm(emb) | hnorm(h)])
    model.layers.{L+k}.<decoder layer keys>          -> mtp.block.<as above>
    model.layers.{L+k}.shared_head.norm              -> mtp.head_norm (`transformer.mtp_spec`; a tree without
                                                        it, MTP reusing final_norm, skips the tensor with a
                                                        warning if it differs from model.norm, and export
                                                        writes final_norm there)
    model.layers.{L+k}.embed_tokens / shared_head.head  copies of the main embed / lm_head: not loaded;
                                                     written on export (DeepSeek-V3 files carry them)

FP8 (the original DeepSeek-V3 release): a ``X.weight`` stored as F8_E4M3 with a sibling
``X.weight_scale_inv`` (float32, one per ``block x block`` tile, block from config.json
``quantization_config.weight_block_size``, default 128) is dequantized on load as
``w[r, c] * scale_inv[r // block, c // block]`` (DeepSeek's `weight_dequant`). Export never quantizes.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import warnings
from typing import Any, Callable, Iterator

import jax
import ml_collections
import ml_dtypes
import numpy as np
from horizon.utils.config import load_config_file
from horizon.model import transformer
from horizon.model import layers
from horizon.data.tokenizer import add_chat_specials
from horizon.data.tokenizer import load_tokenizer
from horizon.utils.config import ConfigError
from horizon.data.tokenizer import resolve_tokenizer_file

# ---------------------------------------------------------------------------------------------
# Config mapping
# ---------------------------------------------------------------------------------------------

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
_YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")


def _model_cfg(cfg) -> ml_collections.ConfigDict:
    """Accept the full config or its `model` section."""
    return cfg.model if "model" in cfg else cfg


def hf_config_from_model_config(cfg) -> dict[str, Any]:
    """`DeepseekV3Config(**kwargs)` keyword arguments for a horizon model config (SPEC §1).

    The dict is JSON-serialisable; `export_hf_checkpoint` writes it (plus legacy keys) as config.json.
    """
    m = _model_cfg(cfg)
    out: dict[str, Any] = {}
    for hf, ours in _SAME_FIELDS:
        out[hf] = m[ours]
    for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "moe_intermediate_size", "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
              "first_k_dense_replace", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
              "max_position_embeddings", "num_nextn_predict_layers"):
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
    rtype = m.rope_scaling.type if "rope_scaling" in m else "none"
    rp: dict[str, Any] = {"rope_type": "default" if rtype == "none" else rtype, "rope_theta": float(m.rope_theta)}
    if rtype == "yarn":
        rs = m.rope_scaling
        rp.update({k: float(rs[k]) for k in _YARN_KEYS})
        rp["original_max_position_embeddings"] = int(rs.original_max_position_embeddings)
    elif rtype != "none":
        raise ValueError(f"rope_scaling.type {rtype!r} has no HF mapping (expected 'none' or 'yarn')")
    out["rope_parameters"] = rp
    return out


def _default_base() -> ml_collections.ConfigDict:
    path = pathlib.Path(__file__).resolve().parents[3] / "configs" / "tiny.py"
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
    checks = {"hidden_act": ("silu",), "scoring_func": ("sigmoid",), "topk_method": ("noaux_tc",),
              "attention_bias": (False,), "moe_layer_freq": (1,), "rope_interleave": (True,)}
    for k, ok in checks.items():
        if k in hf and hf[k] not in ok:
            raise ValueError(f"unsupported HF config {k}={hf[k]!r} (supported: {ok})")
    all_dense = (hf.get("first_k_dense_replace") or 0) >= hf.get("num_hidden_layers", 0)
    if hf.get("n_routed_experts") in (None, 0) and not all_dense:
        raise ValueError("HF config has MoE layers but no routed experts (n_routed_experts)")
    m = ml_collections.ConfigDict((base if base is not None else _default_base()).to_dict())
    defaults = {"n_shared_experts": 0, "first_k_dense_replace": 0, "norm_topk_prob": True,
                "tie_word_embeddings": False, "num_nextn_predict_layers": 0, "routed_scaling_factor": 1.0,
                "n_routed_experts": 0}
    for hf_name, ours in _SAME_FIELDS:
        v = hf.get(hf_name)
        if v is None:
            if hf_name not in defaults:
                raise ValueError(f"HF config lacks required field {hf_name!r}")
            v = defaults[hf_name]
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
    return m


def read_hf_config(path: str | os.PathLike) -> dict[str, Any]:
    """config.json of a checkpoint dir (or the path of a config.json / of a file next to one)."""
    p = pathlib.Path(path)
    cand = p if p.name == "config.json" else (p / "config.json" if p.is_dir() else p.with_name("config.json"))
    if not cand.exists():
        raise FileNotFoundError(f"no config.json at {cand}")
    return json.loads(cand.read_text())


# ---------------------------------------------------------------------------------------------
# safetensors reading / writing (header + memmap; format: u64 LE header size, JSON header, data)
# ---------------------------------------------------------------------------------------------

_ST_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}


def _read_header(path: pathlib.Path) -> tuple[dict, int]:
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: not a safetensors file (too short)")
        n = int.from_bytes(raw, "little")
        if n <= 0 or n > 100_000_000:
            raise ValueError(f"{path}: implausible safetensors header size {n}")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


class CheckpointReader:
    """Lazy tensor access over one .safetensors file or a (sharded) checkpoint directory.

    Hand-written rather than the `safetensors` library because that library's numpy backend cannot
    read the F8 block-scaled weights of the original DeepSeek-V3 / Kimi-K2 releases: with
    safetensors 0.8.0, ``safetensors.numpy.load_file`` and ``safe_open(framework="numpy")`` (and
    ``"flax"``) on a file with an F8_E4M3 tensor (written by `write_safetensors` or by torch) raise
    ``AttributeError: module 'numpy' has no attribute 'float8_e4m3fn'``; only the torch backend reads
    it, and torch is not a dependency. Here every tensor is a zero-copy memmap view in its ml_dtypes
    dtype (`raw`), read one at a time, and `get` dequantizes ``weight`` x ``weight_scale_inv``.
    """

    def __init__(self, path: str | os.PathLike):
        p = pathlib.Path(path)
        if p.is_dir():
            index = p / "model.safetensors.index.json"
            if index.exists():
                files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            else:
                files = sorted(f.name for f in p.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no .safetensors files in {p}")
            paths = [p / f for f in files]
        elif p.exists():
            paths = [p]
        else:
            raise FileNotFoundError(f"checkpoint not found: {p}")
        self.entries: dict[str, tuple[pathlib.Path, dict, int]] = {}
        for fp in paths:
            header, data_start = _read_header(fp)
            for name, info in header.items():
                if name in self.entries:
                    raise ValueError(f"tensor {name!r} appears in two shards ({self.entries[name][0]}, {fp})")
                if info["dtype"] not in _ST_DTYPES:
                    raise ValueError(f"{fp}: tensor {name!r} has unsupported dtype {info['dtype']}")
                self.entries[name] = (fp, info, data_start)
        self._maps: dict[pathlib.Path, np.memmap] = {}
        cfg_dir = p if p.is_dir() else p.parent
        self.block = 128
        if (cfg_dir / "config.json").exists():
            qc = json.loads((cfg_dir / "config.json").read_text()).get("quantization_config") or {}
            bs = qc.get("weight_block_size")
            if bs:
                if len(set(bs)) != 1:
                    raise ValueError(f"non-square fp8 weight_block_size {bs} not supported")
                self.block = int(bs[0])

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def keys(self) -> list[str]:
        return list(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.entries[name][1]["shape"])

    def raw(self, name: str) -> np.ndarray:
        """The stored tensor (a memmap view; copy before keeping)."""
        fp, info, start = self.entries[name]
        if fp not in self._maps:
            self._maps[fp] = np.memmap(fp, dtype=np.uint8, mode="r")
        b, e = info["data_offsets"]
        dt = _ST_DTYPES[info["dtype"]]
        return self._maps[fp][start + b:start + e].view(dt).reshape(info["shape"])

    def get(self, name: str) -> np.ndarray:
        """The tensor as a float32 (or integer) array, fp8 ``weight`` + ``weight_scale_inv`` dequantized."""
        x = self.raw(name)
        if x.dtype in (_ST_DTYPES["F8_E4M3"], _ST_DTYPES["F8_E5M2"]):
            sname = name + "_scale_inv"
            if sname not in self.entries:
                raise ValueError(f"fp8 tensor {name!r} has no {sname!r} to dequantize with")
            s = np.asarray(self.raw(sname), np.float32)
            if x.ndim != 2 or s.shape != tuple(math.ceil(d / self.block) for d in x.shape):
                raise ValueError(f"{sname}: shape {s.shape} does not tile {x.shape} in {self.block}-blocks")
            full = np.repeat(np.repeat(s, self.block, 0), self.block, 1)[: x.shape[0], : x.shape[1]]
            return x.astype(np.float32) * full
        return np.asarray(x, np.float32) if x.dtype.kind == "f" else np.array(x)

    def close(self) -> None:
        self._maps.clear()


TensorSource = tuple[str, tuple[int, ...], np.dtype, Callable[[], np.ndarray]]  # name, shape, dtype, producer


def write_safetensors(path: str | os.PathLike, tensors: list[TensorSource],
                      metadata: dict[str, str] | None = None) -> None:
    """Write `(name, shape, dtype, producer)` entries, calling each producer only when its bytes are written."""
    header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
    off = 0
    for name, shape, dt, _ in tensors:
        dt = np.dtype(dt)
        if dt not in _ST_NAMES:
            raise ValueError(f"{name}: dtype {dt} cannot be stored in safetensors")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        header[name] = {"dtype": _ST_NAMES[dt], "shape": list(shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        for name, shape, dt, produce in tensors:
            a = np.ascontiguousarray(produce(), dtype=dt)
            if a.shape != tuple(shape):
                raise ValueError(f"{name}: producer gave shape {a.shape}, header says {tuple(shape)}")
            f.write(a.tobytes())


# ---------------------------------------------------------------------------------------------
# Name mapping
# ---------------------------------------------------------------------------------------------

# An entry maps one HF tensor into one leaf slot: (hf_name, leaf path, index prefix, transform kind).
# kind: "T" = Linear weight, transpose 2-D; "C" = copy.
Entry = tuple[str, tuple[str, ...], tuple[int, ...], str]


def _layer_entries(prefix: str, path: tuple[str, ...], idx: tuple[int, ...], layer_tree: dict, cfg) -> list[Entry]:
    """Entries of one decoder layer whose param sub-tree (without the layer axis) is `layer_tree`."""
    out: list[Entry] = [
        (f"{prefix}.input_layernorm.weight", path + ("attn_norm",), idx, "C"),
        (f"{prefix}.post_attention_layernorm.weight", path + ("mlp_norm",), idx, "C"),
    ]
    a = path + ("attn",)
    attn_names = {"wq_a": ("q_a_proj.weight", "T"), "q_norm": ("q_a_layernorm.weight", "C"),
                  "wq_b": ("q_b_proj.weight", "T"), "wq": ("q_proj.weight", "T"),
                  "wkv_a": ("kv_a_proj_with_mqa.weight", "T"), "kv_norm": ("kv_a_layernorm.weight", "C"),
                  "wkv_b": ("kv_b_proj.weight", "T"), "wo": ("o_proj.weight", "T")}
    for leaf in layer_tree["attn"]:
        if leaf not in attn_names:
            raise ValueError(f"attention leaf {leaf!r} has no HF name")
        hf, kind = attn_names[leaf]
        out.append((f"{prefix}.self_attn.{hf}", a + (leaf,), idx, kind))
    if "mlp" in layer_tree:
        for w in ("gate", "up", "down"):
            out.append((f"{prefix}.mlp.{w}_proj.weight", path + ("mlp", w), idx, "T"))
    if "moe" in layer_tree:
        mo = path + ("moe",)
        out.append((f"{prefix}.mlp.gate.weight", mo + ("router",), idx, "T"))
        out.append((f"{prefix}.mlp.gate.e_score_correction_bias", mo + ("router_bias",), idx, "C"))
        for j in range(cfg.num_experts):
            for w in ("gate", "up", "down"):
                out.append((f"{prefix}.mlp.experts.{j}.{w}_proj.weight", mo + ("experts", w), idx + (j,), "T"))
        if "shared" in layer_tree["moe"]:
            for w in ("gate", "up", "down"):
                out.append((f"{prefix}.mlp.shared_experts.{w}_proj.weight", mo + ("shared", w), idx, "T"))
    return out


def hf_entries(spec: dict, cfg) -> list[Entry]:
    """Every (HF tensor -> param slot) pair for a param tree shaped like `spec`."""
    m = _model_cfg(cfg)
    out: list[Entry] = [("model.embed_tokens.weight", ("embed",), (), "C"),
                        ("model.norm.weight", ("final_norm",), (), "C")]
    if "lm_head" in spec:
        out.append(("lm_head.weight", ("lm_head",), (), "T"))
    # layer split as the param tree has it (all layers dense when the model has no experts)
    n_dense = jax.tree.leaves(spec["dense"])[0].shape[0] if "dense" in spec else 0
    for i in range(m.num_layers):
        group, li = ("dense", i) if i < n_dense else ("moe", i - n_dense)
        if group not in spec:
            raise ValueError(f"layer {i} belongs to group {group!r}, which the param tree lacks")
        out += _layer_entries(f"model.layers.{i}", (group,), (li,), spec[group], m)
    if m.mtp_depth > 0:
        mtp = spec["mtp"]
        for k in range(m.mtp_depth):
            pre = f"model.layers.{m.num_layers + k}"
            out += [(f"{pre}.enorm.weight", ("mtp", "enorm"), (k,), "C"),
                    (f"{pre}.hnorm.weight", ("mtp", "hnorm"), (k,), "C"),
                    (f"{pre}.eh_proj.weight", ("mtp", "proj"), (k,), "T")]
            if "head_norm" in mtp:
                out.append((f"{pre}.shared_head.norm.weight", ("mtp", "head_norm"), (k,), "C"))
            out += _layer_entries(pre, ("mtp", "block"), (k,), mtp["block"], m)
    return out


def _get_path(tree: dict, path: tuple[str, ...]):
    for p in path:
        tree = tree[p]
    return tree


def _param_spec(cfg) -> dict:
    """Shapes/dtypes of `transformer.init(key, cfg)` without allocating (the model is the source of truth)."""
    return jax.eval_shape(lambda k: transformer.init(k, _model_cfg(cfg)), jax.random.PRNGKey(0))


_FUSED = re.compile(r"^(.*)\.mlp\.experts\.(gate_up_proj|down_proj)$")
_IGNORED = (re.compile(r".*rotary_emb\.inv_freq$"),)


def _transform(x: np.ndarray, kind: str) -> np.ndarray:
    if kind == "T":
        if x.ndim != 2:
            raise ValueError(f"Linear weight must be 2-D, got shape {x.shape}")
        return x.T
    return x


# ---------------------------------------------------------------------------------------------
# Load / export
# ---------------------------------------------------------------------------------------------


def _mtp_layer_of(name: str, cfg) -> int | None:
    """k when `name` is a tensor of MTP layer ``model.layers.{L+k}`` (``k < mtp_depth``), else None."""
    m = _model_cfg(cfg)
    mt = re.match(r"^model\.layers\.(\d+)\.", name)
    if mt is None:
        return None
    k = int(mt.group(1)) - m.num_layers
    return k if 0 <= k < m.mtp_depth else None


def _has_mtp_tensors(reader: CheckpointReader, cfg) -> bool:
    return any(_mtp_layer_of(n, cfg) is not None for n in reader.keys())


def fresh_mtp_params(cfg, seed: int, sharding=None) -> dict:
    """A freshly initialised MTP subtree (issue 22): ``layers.materialize(PRNGKey(seed), mtp_spec(cfg))``,
    the repo's own init rules (matrices ~ N(0, init_std^2), norms 1, router bias 0); deterministic in
    `seed`. `sharding`: a pytree of shardings for the subtree (jit ``out_shardings``), or None."""
    spec = transformer.mtp_spec(_model_cfg(cfg))
    return jax.jit(lambda k: layers.materialize(k, spec), out_shardings=sharding)(jax.random.PRNGKey(seed))


def _show(names: list[str], n: int = 8) -> str:
    return f"{names[:n]}{' ...' if len(names) > n else ''}"


def _missing_error(missing: list[str], path, cfg, has_mtp: bool) -> KeyError:
    """The error for tensors the param tree needs but the checkpoint lacks (dense/attention/expert
    tensors listed first, in `hf_entries` order)."""
    m = _model_cfg(cfg)
    if all(_mtp_layer_of(n, m) is not None for n in missing):
        if has_mtp:
            return KeyError(f"corrupt checkpoint {path}: it holds some tensors of the {m.mtp_depth} MTP layer(s) "
                            f"(model.layers.{m.num_layers}+) but {len(missing)} are missing: {_show(missing)}")
        return KeyError(f"{path} holds no MTP tensors for mtp_depth={m.mtp_depth} and mtp_init_seed=None "
                        f"(pass a seed to initialise them fresh): {_show(missing)}")
    return KeyError(f"{len(missing)} tensors missing from {path}: {_show(missing)}")


def load_hf_checkpoint(path: str | os.PathLike, cfg, *, strict: bool = True, shardings=None,
                       mtp_init_seed: int | None = 0) -> dict:
    """Read DeepSeek-V3-format safetensors (file or sharded dir) into horizon params (SPEC §1).

    Tensors stream one at a time into preallocated host buffers in the dtypes of `transformer.init`
    (param_dtype; router_bias float32), then move to device (with `shardings`, a matching pytree of
    `jax.sharding.Sharding`, if given). `strict`: unknown tensors in the file are an error (MTP layers
    are skipped when ``mtp_depth == 0``). Missing tensors are an error, with one exception (issue 22):
    ``mtp_depth > 0`` and the checkpoint holds no tensor of any MTP layer (what transformers'
    ``save_pretrained`` writes) -> the MTP subtree is `fresh_mtp_params(cfg, mtp_init_seed)`, with one
    warning; ``mtp_init_seed=None`` makes that an error too. Some but not all MTP tensors: an error.
    """
    m = _model_cfg(cfg)
    full_spec = _param_spec(m)
    reader = CheckpointReader(path)
    has_mtp = _has_mtp_tensors(reader, m)
    fresh_mtp = m.mtp_depth > 0 and not has_mtp and mtp_init_seed is not None
    # the subtrees the file's tensors fill: all of them, or all but MTP when it is initialised fresh
    spec = {k: v for k, v in full_spec.items() if not (fresh_mtp and k == "mtp")}
    bufs = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), spec)
    counts: dict[tuple[str, ...], int] = {}
    used: set[str] = set()
    missing: list[str] = []

    def put(path_: tuple[str, ...], idx: tuple[int, ...], val: np.ndarray, name: str) -> None:
        buf = _get_path(bufs, path_)
        slot_shape = buf.shape[len(idx):]
        if val.shape != slot_shape:
            raise ValueError(f"{name}: shape {val.shape} (after transform) != param {'/'.join(path_)}{list(idx)} "
                             f"slot shape {slot_shape}")
        buf[idx] = val.astype(buf.dtype)
        counts[path_] = counts.get(path_, 0) + (int(np.prod(slot_shape)) if slot_shape else 1)

    fused_done: set[str] = set()
    for name, path_, idx, kind in hf_entries(full_spec, m):
        if path_[0] not in spec:
            continue
        if name in reader:
            put(path_, idx, _transform(reader.get(name), kind), name)
            used.add(name)
            continue
        mfused = re.match(r"^(.*)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$", name)
        if mfused:  # transformers>=5 in-memory layout: [E, 2F, D] gate|up and [E, D, F]
            pre, j, w = mfused.group(1), int(mfused.group(2)), mfused.group(3)
            fname = f"{pre}.mlp.experts.{'down_proj' if w == 'down' else 'gate_up_proj'}"
            if fname in reader:
                key = f"{fname}/{w}"
                if key not in fused_done:
                    x = reader.get(fname)
                    if w != "down":
                        F = x.shape[1] // 2
                        x = x[:, :F] if w == "gate" else x[:, F:]
                    x = np.swapaxes(x, 1, 2)
                    for e in range(x.shape[0]):
                        put(path_, idx[:-1] + (e,), x[e], fname)
                    fused_done.add(key)
                    used.add(fname)
                continue
        if path_ == ("lm_head",) and m.tie_embeddings and "model.embed_tokens.weight" in reader:
            put(path_, idx, reader.get("model.embed_tokens.weight").T, name)
            continue
        missing.append(name)
    if missing:
        raise _missing_error(missing, path, m, has_mtp)

    L = m.num_layers
    unknown = []
    for name in reader.keys():
        if name in used or name.endswith("_scale_inv") or any(p.match(name) for p in _IGNORED):
            continue
        if name == "lm_head.weight" and "lm_head" not in spec:
            continue  # tied model: some writers keep the (identical) head anyway
        mt = re.match(r"^model\.layers\.(\d+)\.", name)
        if mt and int(mt.group(1)) >= L:
            k = int(mt.group(1)) - L
            if k < m.mtp_depth and name.endswith(".shared_head.norm.weight"):
                # horizon's MTP reuses the main final_norm; a different checkpoint norm is lost.
                if not np.allclose(reader.get(name), reader.get("model.norm.weight")):
                    warnings.warn(f"{name} differs from model.norm.weight but horizon's MTP head uses the main "
                                  "final_norm (no per-depth head norm in the param tree): it is not loaded")
                continue
            if k >= m.mtp_depth or re.search(r"\.(embed_tokens|shared_head\.head)\.weight$", name):
                continue  # MTP layers not requested, or the MTP copies of embed / lm_head
        unknown.append(name)
    if unknown and strict:
        raise KeyError(f"{len(unknown)} unexpected tensors in {path}: {unknown[:8]} (strict=False to ignore)")

    for path_, n in counts.items():
        if n != _get_path(bufs, path_).size:
            raise ValueError(f"param {'/'.join(path_)}: only {n} of {_get_path(bufs, path_).size} values were loaded")
    leaves_paths = [tuple(getattr(k, "key", k) for k in kp) for kp, _ in jax.tree_util.tree_leaves_with_path(spec)]
    unfilled = [p for p in leaves_paths if p not in counts]
    if unfilled:
        raise ValueError(f"params with no HF tensor: {['/'.join(p) for p in unfilled]}")
    reader.close()
    if shardings is None:
        params = jax.tree.map(lambda b: jax.device_put(b), bufs)
    else:
        params = jax.tree.map(lambda b, s: jax.device_put(b, s), bufs, {k: shardings[k] for k in bufs})
    if fresh_mtp:
        params["mtp"] = fresh_mtp_params(m, mtp_init_seed, None if shardings is None else shardings["mtp"])
        warnings.warn(f"{path}: no MTP tensors for mtp_depth={m.mtp_depth} (config.json num_nextn_predict_layers; "
                      f"transformers' save_pretrained writes none): initialised {m.mtp_depth} MTP layer(s) fresh "
                      f"with mtp_init_seed={mtp_init_seed}, as the report trains MTP from scratch", stacklevel=2)
    return params


_HOST_COPY_BYTES = 256 * 2**20  # export: leaves up to this size are copied to host whole


def _np_dtype(name: str) -> np.dtype:
    table = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
    if name not in table:
        raise ValueError(f"unknown export dtype {name!r}; expected one of {sorted(table)}")
    return np.dtype(table[name])


def export_hf_checkpoint(params: dict, cfg, out_dir: str | os.PathLike, *, dtype: str | None = None,
                         max_shard_bytes: int = 5 * 2**30) -> list[pathlib.Path]:
    """Write `params` as a DeepSeek-V3-format checkpoint: per-expert safetensors + config.json (SPEC §1).

    `dtype` (None = keep each leaf's dtype; router bias always stays float32) casts weights. Shards
    above `max_shard_bytes` get a `model.safetensors.index.json`. Returns the written tensor files.
    """
    m = _model_cfg(cfg)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    entries = hf_entries(params, m)

    def leaf(path_):
        return _get_path(params, path_)

    small: dict = {}  # whole host copies of leaves below `_HOST_COPY_BYTES`
    big: dict = {}  # one layer-slice of one large leaf at a time

    def host_slice(x, path_, idx):
        """Host copy of `x[idx]`: small leaves are fetched once whole (no per-slice device gathers);
        large leaves one layer at a time (consecutive experts of a layer reuse it)."""
        if x.nbytes <= _HOST_COPY_BYTES:
            if path_ not in small:
                small[path_] = np.asarray(jax.device_get(x))
            return small[path_][idx]
        key = (path_, idx)
        if key not in big:
            big.clear()
            big[key] = np.asarray(jax.device_get(x[idx] if idx else x))
        return big[key]

    tensors: list[TensorSource] = []
    for name, path_, idx, kind in entries:
        x = leaf(path_)
        shape = tuple(x.shape[len(idx):])
        if kind == "T":
            shape = shape[::-1]
        dt = np.dtype(x.dtype) if (dtype is None or path_[-1] == "router_bias") else _np_dtype(dtype)

        def produce(x=x, path_=path_, idx=idx, kind=kind):
            v = host_slice(x, path_, idx[:1])[idx[1:]]
            return v.T if kind == "T" else v

        tensors.append((name, shape, dt, produce))
    if m.mtp_depth > 0:  # DeepSeek-V3 files carry per-MTP-layer copies of embed and lm_head
        for k in range(m.mtp_depth):
            pre = f"model.layers.{m.num_layers + k}"
            dt_of = (lambda a: np.dtype(a.dtype) if dtype is None else _np_dtype(dtype))
            e = params["embed"]
            tensors.append((f"{pre}.embed_tokens.weight", tuple(e.shape), dt_of(e), lambda e=e: np.asarray(e)))
            head = params["lm_head"] if "lm_head" in params else params["embed"].T
            tensors.append((f"{pre}.shared_head.head.weight", tuple(head.shape[::-1]), dt_of(head),
                            lambda h=head: np.asarray(h).T))
            if "head_norm" not in params["mtp"]:  # no own MTP output norm: the main final norm plays its role
                fn = params["final_norm"]
                tensors.append((f"{pre}.shared_head.norm.weight", tuple(fn.shape), dt_of(fn),
                                lambda f=fn: np.asarray(f)))

    shards: list[list] = [[]]
    size = 0
    for t in tensors:
        nb = int(np.prod(t[1], dtype=np.int64)) * t[2].itemsize
        if shards[-1] and size + nb > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += nb
    files = []
    if len(shards) == 1:
        files.append(out / "model.safetensors")
        write_safetensors(files[0], shards[0])
    else:
        weight_map, total = {}, 0
        for i, sh in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(out / fname, sh)
            files.append(out / fname)
            for t in sh:
                weight_map[t[0]] = fname
                total += int(np.prod(t[1], dtype=np.int64)) * t[2].itemsize
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    hf = hf_config_from_model_config(m)
    hf.update({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
               "topk_method": "noaux_tc", "scoring_func": "sigmoid", "moe_layer_freq": 1,
               "dtype": {np.dtype(np.float32): "float32", _np_dtype("bfloat16"): "bfloat16",
                         np.dtype(np.float16): "float16"}.get(np.dtype(params["embed"].dtype) if dtype is None
                                                               else _np_dtype(dtype), "float32")})
    (out / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True))
    return files


def load_pretrained(path: str | os.PathLike, base=None, **kw) -> tuple[ml_collections.ConfigDict, dict]:
    """(model config, params) from an HF checkpoint dir (config.json + ``*.safetensors``, with or without
    ``model.safetensors.index.json``; as transformers' ``save_pretrained`` or `export_hf_checkpoint`
    writes it): `model_config_from_hf` (fields without an HF name from `base`, default configs/tiny.py)
    + `load_hf_checkpoint` (`kw`: ``strict``, ``shardings``, ``mtp_init_seed`` (default 0): declared
    MTP layers absent from the files are initialised fresh, issue 22)."""
    m = model_config_from_hf(read_hf_config(path), base=base)
    return m, load_hf_checkpoint(path, m, **kw)


def iter_hf_names(cfg) -> Iterator[str]:
    """HF tensor names a checkpoint for `cfg` holds (per-expert layout), for inspection/tests."""
    for name, *_ in hf_entries(_param_spec(cfg), cfg):
        yield name


# ----------------------------------------------------------------------------- model.init_from
CHAT_TOKENIZER_FILE = "tokenizer.horizon.json"   # a checkpoint tokenizer with horizon's chat specials added


def apply_init_from(c) -> None:
    """Derive the model section of a run that starts from an HF checkpoint directory
    (`model.init_from`, issue 22; `horizon.utils.cli.load`'s `derive` hook, before validation):
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

        f = resolve_tokenizer_file(spec)
        out = f.parent / CHAT_TOKENIZER_FILE
        added = add_chat_specials(f, out)
        warnings.warn(f"{f}: added horizon's chat special tokens {added} -> {out}; their embedding and LM-head "
                      "rows are initialised fresh (hf_import.pretrained_params)", stacklevel=2)
        m.tokenizer = str(out)
    m.vocab_size = max(int(m.vocab_size), int(load_tokenizer(str(m.tokenizer)).vocab_size))


def pretrained_params(c, key: jax.Array) -> dict:
    """The params of `model.init_from` for the (derived, `apply_init_from`) model config `c.model`:
    the checkpoint's tensors, with vocabulary rows past the checkpoint's (chat specials that were
    added) drawn like `transformer.init` draws embeddings (N(0, init_std^2), from `key`)."""
    m = c.model
    d = str(m.init_from)
    m0 = model_config_from_hf(read_hf_config(d), base=m)
    params = load_hf_checkpoint(d, m0)
    extra = int(m.vocab_size) - int(m0.vocab_size)
    if extra <= 0:
        return params
    k1, k2 = jax.random.split(key)
    std = float(m.init_std)
    grow = {"embed": (0, k1), "lm_head": (1, k2)}
    for name, (axis, k) in grow.items():
        if name not in params:
            continue
        w = params[name]
        shape = list(w.shape)
        shape[axis] = extra
        new = (std * jax.random.normal(k, tuple(shape), np.float32)).astype(w.dtype)
        params[name] = jax.numpy.concatenate([w, new], axis=axis)
    return params
