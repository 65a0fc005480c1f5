"""horizon params -> HF DeepSeek-V3 checkpoint (`docs/SPEC.md §1.5`).

Writes the on-disk layout DeepSeek-V3 releases use (per-expert tensors, MTP layers with their copies
of embed / lm_head), never quantized, streaming one tensor at a time from device to file.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import jax
import ml_dtypes
import numpy as np

from horizon.model.hf.config import hf_config_from_model_config, model_section
from horizon.model.hf.names import get_path, hf_entries, mtp_prefix
from horizon.model.hf.safetensors import TensorSource, tensor_nbytes, write_safetensors

_HOST_COPY_BYTES = 256 * 2**20  # leaves up to this size are copied to host whole
_EXPORT_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16),
                  "float16": np.dtype(np.float16)}


def _np_dtype(name: str) -> np.dtype:
    """numpy dtype of an export `dtype` name."""
    if name not in _EXPORT_DTYPES:
        raise ValueError(f"unknown export dtype {name!r}; expected one of {sorted(_EXPORT_DTYPES)}")
    return _EXPORT_DTYPES[name]


class _HostSlices:
    """Host copies of param slices: small leaves are fetched once whole (no per-slice device
    gathers); large leaves one layer at a time (consecutive experts of a layer reuse it)."""

    def __init__(self):
        self.small: dict = {}  # whole host copies of leaves below `_HOST_COPY_BYTES`
        self.big: dict = {}  # one layer-slice of one large leaf at a time

    def get(self, x, path: tuple[str, ...], idx: tuple[int, ...]) -> np.ndarray:
        """Host copy of `x[idx]` (`idx`: at most the layer index), `x` being the leaf at `path`."""
        if x.nbytes <= _HOST_COPY_BYTES:
            if path not in self.small:
                self.small[path] = np.asarray(jax.device_get(x))
            return self.small[path][idx]
        key = (path, idx)
        if key not in self.big:
            self.big.clear()
            self.big[key] = np.asarray(jax.device_get(x[idx] if idx else x))
        return self.big[key]


def _param_tensors(params: dict, cfg, dtype: str | None) -> list[TensorSource]:
    """One `TensorSource` per `hf_entries` tensor of `params` (router bias always float32)."""
    host = _HostSlices()
    tensors: list[TensorSource] = []
    for name, path, idx, kind in hf_entries(params, cfg):
        x = get_path(params, path)
        shape = tuple(x.shape[len(idx):])
        if kind == "T":
            shape = shape[::-1]
        dt = np.dtype(x.dtype) if (dtype is None or path[-1] == "router_bias") else _np_dtype(dtype)

        def produce(x=x, path=path, idx=idx, kind=kind):
            v = host.get(x, path, idx[:1])[idx[1:]]
            return v.T if kind == "T" else v

        tensors.append((name, shape, dt, produce))
    return tensors


def _mtp_copy_tensors(params: dict, cfg, dtype: str | None) -> list[TensorSource]:
    """The per-MTP-layer copies of embed and lm_head that DeepSeek-V3 files carry (and of the final
    norm, when the MTP subtree has no own output norm)."""
    m = model_section(cfg)

    def dt_of(a) -> np.dtype:
        return np.dtype(a.dtype) if dtype is None else _np_dtype(dtype)

    tensors: list[TensorSource] = []
    for k in range(m.mtp_depth):
        pre = mtp_prefix(m, k)
        e = params["embed"]
        tensors.append((f"{pre}.embed_tokens.weight", tuple(e.shape), dt_of(e), lambda e=e: np.asarray(e)))
        head = params["lm_head"] if "lm_head" in params else params["embed"].T
        tensors.append((f"{pre}.shared_head.head.weight", tuple(head.shape[::-1]), dt_of(head),
                        lambda h=head: np.asarray(h).T))
        if "head_norm" not in params["mtp"]:  # no own MTP output norm: the main final norm plays its role
            fn = params["final_norm"]
            tensors.append((f"{pre}.shared_head.norm.weight", tuple(fn.shape), dt_of(fn),
                            lambda f=fn: np.asarray(f)))
    return tensors


def _split_shards(tensors: list[TensorSource], max_shard_bytes: int) -> list[list[TensorSource]]:
    """Consecutive groups of `tensors` of at most `max_shard_bytes` each (a larger tensor alone)."""
    shards: list[list[TensorSource]] = [[]]
    size = 0
    for t in tensors:
        nb = tensor_nbytes(t)
        if shards[-1] and size + nb > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += nb
    return shards


def _write_shards(out: pathlib.Path, shards: list[list[TensorSource]]) -> list[pathlib.Path]:
    """``model.safetensors``, or numbered shards plus ``model.safetensors.index.json``."""
    if len(shards) == 1:
        write_safetensors(out / "model.safetensors", shards[0])
        return [out / "model.safetensors"]
    files, weight_map, total = [], {}, 0
    for i, sh in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(out / fname, sh)
        files.append(out / fname)
        for t in sh:
            weight_map[t[0]] = fname
            total += tensor_nbytes(t)
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return files


def _hf_config_json(params: dict, cfg, dtype: str | None) -> dict[str, Any]:
    """config.json: `hf_config_from_model_config` plus the keys DeepSeek-V3's own config.json sets."""
    hf = hf_config_from_model_config(cfg)
    dt = np.dtype(params["embed"].dtype) if dtype is None else _np_dtype(dtype)
    hf.update({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
               "topk_method": "noaux_tc", "scoring_func": "sigmoid", "moe_layer_freq": 1,
               "dtype": {v: k for k, v in _EXPORT_DTYPES.items()}.get(dt, "float32")})
    return hf


def export_hf_checkpoint(params: dict, cfg, out_dir: str | os.PathLike, *, dtype: str | None = None,
                         max_shard_bytes: int = 5 * 2**30) -> list[pathlib.Path]:
    """Write `params` as a DeepSeek-V3-format checkpoint: per-expert safetensors + config.json
    (`docs/SPEC.md §1.5`).

    `dtype` (None = keep each leaf's dtype; router bias always stays float32) casts weights. Shards
    above `max_shard_bytes` get a `model.safetensors.index.json`. Returns the written tensor files.
    """
    m = model_section(cfg)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = _param_tensors(params, m, dtype) + _mtp_copy_tensors(params, m, dtype)
    files = _write_shards(out, _split_shards(tensors, max_shard_bytes))
    (out / "config.json").write_text(json.dumps(_hf_config_json(params, m, dtype), indent=2, sort_keys=True))
    return files
