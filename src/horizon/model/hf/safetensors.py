"""Torch-free safetensors reader and writer (format: u64 LE header size, JSON header, raw data).

Tensors are read one at a time as `np.memmap` views in any dtype ml_dtypes knows (F32/F16/BF16/
F8_E4M3/...) and written from per-tensor producers, so a checkpoint streams through host memory
tensor by tensor.

FP8 (the original DeepSeek-V3 release): a ``X.weight`` stored as F8_E4M3 with a sibling
``X.weight_scale_inv`` (float32, one per ``block x block`` tile, block from config.json
``quantization_config.weight_block_size``, default 128) is dequantized on read as
``w[r, c] * scale_inv[r // block, c // block]`` (DeepSeek's `weight_dequant`). Nothing is written
quantized.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

# safetensors dtype name <-> numpy dtype
ST_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
ST_NAMES: dict[np.dtype, str] = {v: k for k, v in ST_DTYPES.items()}

TensorSource = tuple[str, tuple[int, ...], np.dtype, Callable[[], np.ndarray]]  # name, shape, dtype, producer


def read_header(path: pathlib.Path) -> tuple[dict, int]:
    """(tensor header without ``__metadata__``, byte offset of the data section) of a .safetensors file."""
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


def _tensor_files(p: pathlib.Path) -> list[pathlib.Path]:
    """The .safetensors files of a checkpoint: `p` itself, or those of dir `p` (per its index, if any)."""
    if p.is_dir():
        index = p / "model.safetensors.index.json"
        if index.exists():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            files = sorted(f.name for f in p.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no .safetensors files in {p}")
        return [p / f for f in files]
    if p.exists():
        return [p]
    raise FileNotFoundError(f"checkpoint not found: {p}")


def _fp8_block(cfg_dir: pathlib.Path) -> int:
    """FP8 scale tile edge from config.json ``quantization_config.weight_block_size`` (default 128)."""
    if not (cfg_dir / "config.json").exists():
        return 128
    qc = json.loads((cfg_dir / "config.json").read_text()).get("quantization_config") or {}
    bs = qc.get("weight_block_size")
    if not bs:
        return 128
    if len(set(bs)) != 1:
        raise ValueError(f"non-square fp8 weight_block_size {bs} not supported")
    return int(bs[0])


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
        self.entries: dict[str, tuple[pathlib.Path, dict, int]] = {}
        for fp in _tensor_files(p):
            header, data_start = read_header(fp)
            for name, info in header.items():
                if name in self.entries:
                    raise ValueError(f"tensor {name!r} appears in two shards ({self.entries[name][0]}, {fp})")
                if info["dtype"] not in ST_DTYPES:
                    raise ValueError(f"{fp}: tensor {name!r} has unsupported dtype {info['dtype']}")
                self.entries[name] = (fp, info, data_start)
        self._maps: dict[pathlib.Path, np.memmap] = {}
        self.block = _fp8_block(p if p.is_dir() else p.parent)

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
        dt = ST_DTYPES[info["dtype"]]
        return self._maps[fp][start + b:start + e].view(dt).reshape(info["shape"])

    def get(self, name: str) -> np.ndarray:
        """The tensor as a float32 (or integer) array, fp8 ``weight`` + ``weight_scale_inv`` dequantized."""
        x = self.raw(name)
        if x.dtype in (ST_DTYPES["F8_E4M3"], ST_DTYPES["F8_E5M2"]):
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


def tensor_nbytes(t: TensorSource) -> int:
    """Bytes of one `TensorSource` on disk."""
    return int(np.prod(t[1], dtype=np.int64)) * np.dtype(t[2]).itemsize


def write_safetensors(path: str | os.PathLike, tensors: list[TensorSource],
                      metadata: dict[str, str] | None = None) -> None:
    """Write `(name, shape, dtype, producer)` entries, calling each producer only when its bytes are written."""
    header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
    off = 0
    for name, shape, dt, _ in tensors:
        dt = np.dtype(dt)
        if dt not in ST_NAMES:
            raise ValueError(f"{name}: dtype {dt} cannot be stored in safetensors")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        header[name] = {"dtype": ST_NAMES[dt], "shape": list(shape), "data_offsets": [off, off + nbytes]}
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
