"""HF DeepSeek-V3 / Kimi-K2 checkpoint -> horizon params (`docs/SPEC.md §1.5`).

``transformers`` declares ``num_nextn_predict_layers`` (default 1) but builds and saves no MTP layer,
so a checkpoint may hold none of them: then the MTP subtree is initialised fresh with the repo's own
init (`fresh_mtp_params`) and one warning (MTP is trained from scratch anyway, `docs/SPEC.md §1.3`).
Some but not all MTP tensors present is a corrupt checkpoint: a hard error naming the missing ones.
"""

from __future__ import annotations

import os
import warnings

import jax
import ml_collections
import numpy as np

from horizon.model import layers, transformer
from horizon.model.hf.config import model_config_from_hf, model_section, read_hf_config
from horizon.model.hf.names import (
    IGNORED,
    MTP_HEAD_COPY,
    Entry,
    fused_expert_source,
    get_path,
    hf_entries,
    layer_index,
    mtp_layer_of,
    param_spec,
    split_fused_experts,
    transform,
)
from horizon.model.hf.safetensors import CheckpointReader


class _HostParams:
    """Zeroed host buffers shaped like a param spec, filled slot by slot; counts the values written."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.bufs = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), spec)
        self.counts: dict[tuple[str, ...], int] = {}

    def put(self, path: tuple[str, ...], idx: tuple[int, ...], val: np.ndarray, name: str) -> None:
        """Write `val` (HF tensor `name`, already in param layout) into ``leaf(path)[idx]``."""
        buf = get_path(self.bufs, path)
        slot_shape = buf.shape[len(idx):]
        if val.shape != slot_shape:
            raise ValueError(f"{name}: shape {val.shape} (after transform) != param {'/'.join(path)}{list(idx)} "
                             f"slot shape {slot_shape}")
        buf[idx] = val.astype(buf.dtype)
        self.counts[path] = self.counts.get(path, 0) + (int(np.prod(slot_shape)) if slot_shape else 1)

    def check_filled(self) -> None:
        """Raise unless every value of every leaf was written."""
        for path, n in self.counts.items():
            if n != get_path(self.bufs, path).size:
                raise ValueError(f"param {'/'.join(path)}: only {n} of {get_path(self.bufs, path).size} values "
                                 "were loaded")
        leaf_paths = [tuple(getattr(k, "key", k) for k in kp)
                      for kp, _ in jax.tree_util.tree_leaves_with_path(self.spec)]
        unfilled = [p for p in leaf_paths if p not in self.counts]
        if unfilled:
            raise ValueError(f"params with no HF tensor: {['/'.join(p) for p in unfilled]}")


def _fill(host: _HostParams, reader: CheckpointReader, entries: list[Entry], cfg) -> tuple[set[str], list[str]]:
    """Copy the tensors of `entries` (those of the subtrees `host` holds) from `reader` into `host`.

    A per-expert tensor absent from the file is read from its fused transformers>=5 tensor; a tied
    model's head from the embedding. Returns (names of the file's tensors used, names missing).
    """
    used: set[str] = set()
    missing: list[str] = []
    fused_done: set[tuple[str, str]] = set()
    for name, path, idx, kind in entries:
        if path[0] not in host.bufs:
            continue
        if name in reader:
            host.put(path, idx, transform(reader.get(name), kind), name)
            used.add(name)
            continue
        fused = fused_expert_source(name)
        if fused is not None and fused[0] in reader:
            if fused not in fused_done:  # all experts of one fused tensor at once
                x = split_fused_experts(reader.get(fused[0]), fused[1])
                for e in range(x.shape[0]):
                    host.put(path, idx[:-1] + (e,), x[e], fused[0])
                fused_done.add(fused)
                used.add(fused[0])
            continue
        if path == ("lm_head",) and cfg.tie_embeddings and "model.embed_tokens.weight" in reader:
            host.put(path, idx, reader.get("model.embed_tokens.weight").T, name)
            continue
        missing.append(name)
    return used, missing


def _unknown_tensors(reader: CheckpointReader, used: set[str], cfg, has_head: bool) -> list[str]:
    """The file's tensors that map to no param slot, less those known to be redundant (fp8 scales,
    RoPE buffers, a tied model's head, MTP layers not requested, MTP copies of embed / head / norm)."""
    m = model_section(cfg)
    unknown = []
    for name in reader.keys():
        if name in used or name.endswith("_scale_inv") or any(p.match(name) for p in IGNORED):
            continue
        if name == "lm_head.weight" and not has_head:
            continue  # tied model: some writers keep the (identical) head anyway
        i = layer_index(name)
        if i is not None and i >= m.num_layers:
            k = i - m.num_layers
            if k < m.mtp_depth and name.endswith(".shared_head.norm.weight"):
                # horizon's MTP reuses the main final_norm; a different checkpoint norm is lost.
                if not np.allclose(reader.get(name), reader.get("model.norm.weight")):
                    warnings.warn(f"{name} differs from model.norm.weight but horizon's MTP head uses the main "
                                  "final_norm (no per-depth head norm in the param tree): it is not loaded",
                                  stacklevel=2)
                continue
            if k >= m.mtp_depth or MTP_HEAD_COPY.search(name):
                continue  # MTP layers not requested, or the MTP copies of embed / lm_head
        unknown.append(name)
    return unknown


def _has_mtp_tensors(reader: CheckpointReader, cfg) -> bool:
    return any(mtp_layer_of(n, cfg) is not None for n in reader.keys())


def _show(names: list[str], n: int = 8) -> str:
    return f"{names[:n]}{' ...' if len(names) > n else ''}"


def _missing_error(missing: list[str], path, cfg, has_mtp: bool) -> KeyError:
    """The error for tensors the param tree needs but the checkpoint lacks (dense/attention/expert
    tensors listed first, in `hf_entries` order)."""
    m = model_section(cfg)
    if all(mtp_layer_of(n, m) is not None for n in missing):
        if has_mtp:
            return KeyError(f"corrupt checkpoint {path}: it holds some tensors of the {m.mtp_depth} MTP layer(s) "
                            f"(model.layers.{m.num_layers}+) but {len(missing)} are missing: {_show(missing)}")
        return KeyError(f"{path} holds no MTP tensors for mtp_depth={m.mtp_depth} and mtp_init_seed=None "
                        f"(pass a seed to initialise them fresh): {_show(missing)}")
    return KeyError(f"{len(missing)} tensors missing from {path}: {_show(missing)}")


def _to_device(bufs: dict, shardings) -> dict:
    """`bufs` on device: default placement, or per leaf as the matching subtrees of `shardings`."""
    if shardings is None:
        return jax.tree.map(lambda b: jax.device_put(b), bufs)
    return jax.tree.map(lambda b, s: jax.device_put(b, s), bufs, {k: shardings[k] for k in bufs})


def fresh_mtp_params(cfg, seed: int, sharding=None) -> dict:
    """A freshly initialised MTP subtree: ``layers.materialize(PRNGKey(seed), mtp_spec(cfg))``, the
    repo's own init rules (matrices ~ N(0, init_std^2), norms 1, router bias 0); deterministic in
    `seed`. `sharding`: a pytree of shardings for the subtree (jit ``out_shardings``), or None."""
    spec = transformer.mtp_spec(model_section(cfg))
    return jax.jit(lambda k: layers.materialize(k, spec), out_shardings=sharding)(jax.random.PRNGKey(seed))


def load_hf_checkpoint(path: str | os.PathLike, cfg, *, strict: bool = True, shardings=None,
                       mtp_init_seed: int | None = 0) -> dict:
    """Read DeepSeek-V3-format safetensors (file or sharded dir) into horizon params (`docs/SPEC.md §1.5`).

    Tensors stream one at a time into preallocated host buffers in the dtypes of `transformer.init`
    (param_dtype; router_bias float32), then move to device (with `shardings`, a matching pytree of
    `jax.sharding.Sharding`, if given). `strict`: unknown tensors in the file are an error (MTP layers
    are skipped when ``mtp_depth == 0``). Missing tensors are an error, with one exception:
    ``mtp_depth > 0`` and the checkpoint holds no tensor of any MTP layer (what transformers'
    ``save_pretrained`` writes) -> the MTP subtree is `fresh_mtp_params(cfg, mtp_init_seed)`, with one
    warning; ``mtp_init_seed=None`` makes that an error too. Some but not all MTP tensors: an error.
    """
    m = model_section(cfg)
    full_spec = param_spec(m)
    reader = CheckpointReader(path)
    has_mtp = _has_mtp_tensors(reader, m)
    fresh_mtp = m.mtp_depth > 0 and not has_mtp and mtp_init_seed is not None
    # the subtrees the file's tensors fill: all of them, or all but MTP when it is initialised fresh
    host = _HostParams({k: v for k, v in full_spec.items() if not (fresh_mtp and k == "mtp")})
    used, missing = _fill(host, reader, hf_entries(full_spec, m), m)
    if missing:
        raise _missing_error(missing, path, m, has_mtp)
    unknown = _unknown_tensors(reader, used, m, has_head="lm_head" in host.bufs)
    if unknown and strict:
        raise KeyError(f"{len(unknown)} unexpected tensors in {path}: {unknown[:8]} (strict=False to ignore)")
    host.check_filled()
    reader.close()
    params = _to_device(host.bufs, shardings)
    if fresh_mtp:
        params["mtp"] = fresh_mtp_params(m, mtp_init_seed, None if shardings is None else shardings["mtp"])
        warnings.warn(f"{path}: no MTP tensors for mtp_depth={m.mtp_depth} (config.json num_nextn_predict_layers; "
                      f"transformers' save_pretrained writes none): initialised {m.mtp_depth} MTP layer(s) fresh "
                      f"with mtp_init_seed={mtp_init_seed}, as the report trains MTP from scratch", stacklevel=2)
    return params


def load_pretrained(path: str | os.PathLike, base=None, **kw) -> tuple[ml_collections.ConfigDict, dict]:
    """(model config, params) from an HF checkpoint dir (config.json + ``*.safetensors``, with or without
    ``model.safetensors.index.json``; as transformers' ``save_pretrained`` or `export_hf_checkpoint`
    writes it): `model_config_from_hf` (fields without an HF name from `base`, default configs/tiny.py)
    + `load_hf_checkpoint` (`kw`: ``strict``, ``shardings``, ``mtp_init_seed`` (default 0): declared
    MTP layers absent from the files are initialised fresh)."""
    m = model_config_from_hf(read_hf_config(path), base=base)
    return m, load_hf_checkpoint(path, m, **kw)


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
