"""HF DeepSeek-V3 tensor names <-> horizon param slots (`docs/SPEC.md §1.5`).

HF `nn.Linear` weights are ``[out, in]``; ours are ``[in, out]``, so every Linear is transposed.
Layer ``i < first_k_dense`` goes to ``params["dense"][..][i]``, the others to
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

MTP: DeepSeek-V3 stores its MTP module as the extra decoder layer ``model.layers.{L+k}``, mapped to
``params["mtp"][..][k]`` only when ``mtp_depth > 0`` (otherwise those layers are skipped)::

    model.layers.{L+k}.enorm / hnorm                 -> mtp.enorm / hnorm
    model.layers.{L+k}.eh_proj.weight [D,2D]         -> mtp.proj [2D,D]   (input = [enorm(emb) | hnorm(h)])
    model.layers.{L+k}.<decoder layer keys>          -> mtp.block.<as above>
    model.layers.{L+k}.shared_head.norm              -> mtp.head_norm (`transformer.mtp_spec`; a tree without
                                                        it, MTP reusing final_norm, skips the tensor with a
                                                        warning if it differs from model.norm, and export
                                                        writes final_norm there)
    model.layers.{L+k}.embed_tokens / shared_head.head  copies of the main embed / lm_head: not loaded;
                                                     written on export (DeepSeek-V3 files carry them)
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import jax
import numpy as np

from horizon.model import transformer
from horizon.model.hf.config import model_section

# An entry maps one HF tensor into one leaf slot: (hf_name, leaf path, index prefix, transform kind).
# kind: "T" = Linear weight, transpose 2-D; "C" = copy.
Entry = tuple[str, tuple[str, ...], tuple[int, ...], str]

# tensors a checkpoint may hold that map to no param
IGNORED = (re.compile(r".*rotary_emb\.inv_freq$"),)
# MTP-layer copies of the main embed / lm_head (not loaded; written on export)
MTP_HEAD_COPY = re.compile(r"\.(embed_tokens|shared_head\.head)\.weight$")
_PER_EXPERT = re.compile(r"^(.*)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_ATTN_NAMES = {"wq_a": ("q_a_proj.weight", "T"), "q_norm": ("q_a_layernorm.weight", "C"),
               "wq_b": ("q_b_proj.weight", "T"), "wq": ("q_proj.weight", "T"),
               "wkv_a": ("kv_a_proj_with_mqa.weight", "T"), "kv_norm": ("kv_a_layernorm.weight", "C"),
               "wkv_b": ("kv_b_proj.weight", "T"), "wo": ("o_proj.weight", "T")}


def _layer_entries(prefix: str, path: tuple[str, ...], idx: tuple[int, ...], layer_tree: dict, cfg) -> list[Entry]:
    """Entries of one decoder layer whose param sub-tree (without the layer axis) is `layer_tree`."""
    out: list[Entry] = [
        (f"{prefix}.input_layernorm.weight", path + ("attn_norm",), idx, "C"),
        (f"{prefix}.post_attention_layernorm.weight", path + ("mlp_norm",), idx, "C"),
    ]
    for leaf in layer_tree["attn"]:
        if leaf not in _ATTN_NAMES:
            raise ValueError(f"attention leaf {leaf!r} has no HF name")
        hf, kind = _ATTN_NAMES[leaf]
        out.append((f"{prefix}.self_attn.{hf}", path + ("attn", leaf), idx, kind))
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


def mtp_prefix(cfg, k: int) -> str:
    """HF name prefix of MTP layer `k`: the decoder layer after the model's last."""
    return f"model.layers.{model_section(cfg).num_layers + k}"


def hf_entries(spec: dict, cfg) -> list[Entry]:
    """Every (HF tensor -> param slot) pair for a param tree shaped like `spec`."""
    m = model_section(cfg)
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
            pre = mtp_prefix(m, k)
            out += [(f"{pre}.enorm.weight", ("mtp", "enorm"), (k,), "C"),
                    (f"{pre}.hnorm.weight", ("mtp", "hnorm"), (k,), "C"),
                    (f"{pre}.eh_proj.weight", ("mtp", "proj"), (k,), "T")]
            if "head_norm" in mtp:
                out.append((f"{pre}.shared_head.norm.weight", ("mtp", "head_norm"), (k,), "C"))
            out += _layer_entries(pre, ("mtp", "block"), (k,), mtp["block"], m)
    return out


def get_path(tree: dict, path: tuple[str, ...]):
    """The subtree (or leaf) of `tree` at key path `path`."""
    for p in path:
        tree = tree[p]
    return tree


def param_spec(cfg) -> dict:
    """Shapes/dtypes of `transformer.init(key, cfg)` without allocating (the model is the source of truth)."""
    return jax.eval_shape(lambda k: transformer.init(k, model_section(cfg)), jax.random.PRNGKey(0))


def transform(x: np.ndarray, kind: str) -> np.ndarray:
    """An HF tensor in the layout of its param slot (entry kind "T": transposed Linear, "C": as is)."""
    if kind == "T":
        if x.ndim != 2:
            raise ValueError(f"Linear weight must be 2-D, got shape {x.shape}")
        return x.T
    return x


def fused_expert_source(name: str) -> tuple[str, str] | None:
    """(fused tensor name, "gate" | "up" | "down") holding per-expert tensor `name` in the
    transformers>=5 layout (``mlp.experts.gate_up_proj`` / ``down_proj``); None for other names."""
    mt = _PER_EXPERT.match(name)
    if mt is None:
        return None
    pre, w = mt.group(1), mt.group(3)
    return f"{pre}.mlp.experts.{'down_proj' if w == 'down' else 'gate_up_proj'}", w


def split_fused_experts(x: np.ndarray, w: str) -> np.ndarray:
    """The `w` ("gate" | "up" | "down") weights of all experts, ``[E, in, out]``, from a fused tensor
    (``gate_up_proj [E, 2F, D]``: gate rows then up rows; ``down_proj [E, D, F]``)."""
    if w != "down":
        F = x.shape[1] // 2
        x = x[:, :F] if w == "gate" else x[:, F:]
    return np.swapaxes(x, 1, 2)


def layer_index(name: str) -> int | None:
    """i of a ``model.layers.{i}.*`` tensor name, else None."""
    mt = _LAYER.match(name)
    return None if mt is None else int(mt.group(1))


def mtp_layer_of(name: str, cfg) -> int | None:
    """k when `name` is a tensor of MTP layer ``model.layers.{L+k}`` (``k < mtp_depth``), else None."""
    m = model_section(cfg)
    i = layer_index(name)
    if i is None:
        return None
    k = i - m.num_layers
    return k if 0 <= k < m.mtp_depth else None


def iter_hf_names(cfg) -> Iterator[str]:
    """HF tensor names a checkpoint for `cfg` holds (per-expert layout), for inspection/tests."""
    for name, *_ in hf_entries(param_spec(cfg), cfg):
        yield name
