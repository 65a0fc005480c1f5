"""Weight sync by compressed deltas through storage addressed by URL (docs/SPEC.md §4 "Weight sync by deltas").

The trainer *publishes* each policy version; rollout workers *receive* it. The directory is a
local path or an fsspec URL (`horizon.utils.files.UrlDir`: a shared filesystem, s3://, gs://);
every write is atomic (tmp file + rename locally, one PUT on an object store) and a version is
committed by its entry and then LATEST, written after its data, so a reader sees a version
completely or not at all. Why storage and not Ray's object store (measured by
benchmarks/transfer.py, docs/PERF.md "Async data paths"): versions must outlive the trainer process
that made them (a restarted trainer re-adopts the newest one as its delta base; a Ray object dies
with its owner). Ray's store is faster on one machine (a 254 MiB full version: 0.4 s put vs 1.3 s
publish), but publishing runs in a background thread (`AsyncPublisher`) and a delta is ~0.1 of a
full version in bf16; at make-run size both take a few ms.

Encoding (per leaf, split into shards of at most `shard_elems` elements so shards can be
compressed in parallel and, on a real cluster, uploaded per rank / per shard):

* the leaf is cast to the publish dtype (`bfloat16` by default: what the samplers run;
  the trainer keeps its f32 master copy) and viewed as unsigned ints of the same width;
* a **delta** is ``bits(new) XOR bits(base)``, base = the previously published version
  (bit-exact, no float arithmetic, so the receiver rebuilds exactly); a **full** snapshot is
  the XOR against zeros, i.e. the raw bits;
* the bytes are *shuffled* (all first bytes, then all second bytes, ...; byte planes), so the
  many all-zero high bytes of an XOR delta form long zero runs, then compressed:
  `codec="xor_zstd"` (zstandard; the configs' default at level 1: on real bf16 and f32 deltas
  within 1-3% of zlib-6's size, 8-11x faster to compress, benchmarks/transfer.py) or `"xor_zlib"`
  (stdlib).

After a small-LR Adam step most bf16 values do not change at all (the step is below half an
ulp), so the delta is mostly zero bytes and compresses far below the full size; see
`tests/rl/test_weight_sync.py` and experiments/rl_async.py for measured ratios.

Layout of `directory`:

    v00000007.bin    concatenated compressed shards of version 7
    v00000007.json   manifest entry (committed last): kind "full" | "delta", base version,
                     dtype, codec, per-leaf shapes and shard offsets, sha256 of the .bin
                     file and sha256 of the rebuilt parameters
    manifest.json    summary of all live versions [{version, kind, base, sha256}, ...]
    LATEST           the newest committed version (an int)

A full snapshot is written every `full_every` versions (and for the first version and
after a restart without a base), so a new or lagging receiver never replays a long chain;
`keep_fulls` bounds how many full-snapshot chains stay on disk.

Receivers rebuild a version by starting from the newest full snapshot <= it (or from their
cached previous version when the chain continues from it) and applying the deltas, and
check every rebuilt version against its manifest sha256 (`IntegrityError` on mismatch).
`AsyncPublisher` moves the device->host copy off the critical path's encode: the trainer only
pays for `np.asarray` of the params; encoding and writing happen in a background thread, so
training does not block on the upload (docs/SPEC.md §4 "pipelined so training never blocks").
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import pathlib
import re
import time
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from horizon.utils.files import UrlDir, url_dir

CODECS = ("xor_zlib", "xor_zstd")
DTYPES = ("bfloat16", "float32")
_VER_RE = re.compile(r"v(\d{8})\.json")


class IntegrityError(RuntimeError):
    """A rebuilt version does not match its manifest sha256 (or a file is corrupt/missing)."""


# ----------------------------------------------------------------------------- pytrees
def _leaf_names(tree: Any) -> tuple[list[str], list[Any], Any]:
    import jax  # noqa: PLC0415 - the orchestrator process never imports jax

    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    names = ["/".join(str(getattr(p, "key", getattr(p, "idx", getattr(p, "name", p)))) for p in path)
             for path, _ in leaves]
    return names, [x for _, x in leaves], treedef


def flatten_params(params: Any) -> dict[str, np.ndarray]:
    """Host copy of a param pytree as {"a/b/c": array}, keys sorted (stable across processes)."""
    names, leaves, _ = _leaf_names(params)
    return dict(sorted((n, np.asarray(x)) for n, x in zip(names, leaves)))


def unflatten_like(flat: dict[str, np.ndarray], template: Any, *, cast: bool = True) -> Any:
    """Rebuild `template`'s structure from `flat` (cast to the template leaves' dtypes if `cast`)."""
    import jax  # noqa: PLC0415

    names, tleaves, treedef = _leaf_names(template)
    if sorted(names) != sorted(flat):
        diff = sorted(set(names) ^ set(flat))[:5]
        raise ValueError(f"published params do not match the template tree (e.g. {diff})")
    out = []
    for n, t in zip(names, tleaves):
        a = flat[n]
        if tuple(a.shape) != tuple(t.shape):
            raise ValueError(f"leaf {n}: published shape {a.shape} != template {t.shape}")
        out.append(a.astype(t.dtype) if cast else a)
    return jax.tree_util.tree_unflatten(treedef, out)


def cast_flat(flat: dict[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    """Cast floating leaves to the publish dtype (round-to-nearest-even); others unchanged."""
    if dtype not in DTYPES:
        raise ValueError(f"publish dtype must be one of {DTYPES}, got {dtype!r}")
    import ml_dtypes  # noqa: PLC0415 - ships with jax

    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    return {k: (np.ascontiguousarray(v.astype(dt)) if np.issubdtype(v.dtype, np.floating)
                or v.dtype == np.dtype(ml_dtypes.bfloat16) else np.ascontiguousarray(v))
            for k, v in flat.items()}


def params_digest(flat: dict[str, np.ndarray]) -> str:
    """sha256 over (name, dtype, shape, raw bytes) of every leaf in key order."""
    h = hashlib.sha256()
    for k in sorted(flat):
        v = np.ascontiguousarray(flat[k])
        h.update(f"{k}|{v.dtype.str}|{v.shape}|".encode())
        h.update(v.tobytes())
    return h.hexdigest()


def nbytes(flat: dict[str, np.ndarray]) -> int:
    return int(sum(v.nbytes for v in flat.values()))


# ----------------------------------------------------------------------------- codec
def bits(a: np.ndarray) -> np.ndarray:
    """`a` flattened and viewed as unsigned ints of its width (what the XOR delta works on)."""
    return np.ascontiguousarray(a).reshape(-1).view(np.dtype(f"u{a.dtype.itemsize}"))


def compressor(codec: str, level: int) -> tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]:
    if codec == "xor_zlib":
        return (lambda b: zlib.compress(b, level)), zlib.decompress
    if codec == "xor_zstd":
        try:
            import zstandard  # noqa: PLC0415
        except ImportError as e:
            raise ValueError("codec 'xor_zstd' needs the zstandard package (pip install zstandard); "
                             "or use 'xor_zlib'") from e
        return (lambda b: zstandard.ZstdCompressor(level=level).compress(b)), \
            (lambda b: zstandard.ZstdDecompressor().decompress(b))
    raise ValueError(f"codec must be one of {CODECS}, got {codec!r}")


def encode_shard(new: np.ndarray, base: np.ndarray | None, compress: Callable[[bytes], bytes]) -> bytes:
    """Compressed byte-shuffled XOR of two equal-shape 1-D uint arrays (base None = zeros)."""
    x = new if base is None else np.bitwise_xor(new, base)
    planes = x.view(np.uint8).reshape(-1, x.dtype.itemsize).T  # byte planes
    return compress(np.ascontiguousarray(planes).tobytes())


def decode_shard(blob: bytes, base: np.ndarray | None, n: int, udtype: np.dtype,
                 decompress: Callable[[bytes], bytes]) -> np.ndarray:
    """Inverse of `encode_shard`."""
    item = np.dtype(udtype).itemsize
    planes = np.frombuffer(decompress(blob), np.uint8).reshape(item, n)
    x = np.ascontiguousarray(planes.T).reshape(-1).view(udtype)
    return x.copy() if base is None else np.bitwise_xor(x, base)


def _vname(v: int) -> str:
    return f"v{int(v):08d}"


def committed_versions(directory: str | pathlib.Path | UrlDir) -> list[int]:
    return sorted(int(m.group(1)) for n in url_dir(directory).names() if (m := _VER_RE.fullmatch(n)))


def read_entry(directory: str | pathlib.Path | UrlDir, version: int) -> dict:
    return json.loads(url_dir(directory).read(f"{_vname(version)}.json"))


def latest_version(directory: str | pathlib.Path | UrlDir) -> int | None:
    """Newest committed version (the LATEST pointer; falls back to scanning entries)."""
    d = url_dir(directory)
    try:
        v = int(d.read("LATEST").decode().strip())
        if d.exists(f"{_vname(v)}.json"):
            return v
    except (FileNotFoundError, ValueError):
        pass
    vs = committed_versions(d)
    return vs[-1] if vs else None


# ----------------------------------------------------------------------------- publisher
@dataclasses.dataclass
class PublishStats:
    version: int
    kind: str
    file_bytes: int           # compressed bytes written for this version
    full_bytes: int           # uncompressed size of the params in the publish dtype
    seconds: float

    @property
    def ratio(self) -> float:
        return self.file_bytes / max(self.full_bytes, 1)


class WeightPublisher:
    """Writes versions as a chain of compressed deltas + periodic full snapshots (module doc)."""

    def __init__(self, directory: str | pathlib.Path | UrlDir, *, dtype: str = "bfloat16", codec: str = "xor_zstd",
                 level: int = 1, full_every: int = 10, keep_fulls: int = 2, shard_elems: int = 1 << 20,
                 num_threads: int = 2):
        if full_every < 1 or keep_fulls < 1 or shard_elems < 1 or num_threads < 1:
            raise ValueError(f"bad publisher options: full_every={full_every} keep_fulls={keep_fulls} "
                             f"shard_elems={shard_elems} num_threads={num_threads}")
        self.dir = url_dir(directory)
        self.dtype, self.codec, self.level = dtype, codec, int(level)
        self.full_every, self.keep_fulls, self.shard_elems = int(full_every), int(keep_fulls), int(shard_elems)
        self._compress, _ = compressor(codec, self.level)
        self._pool = concurrent.futures.ThreadPoolExecutor(num_threads) if num_threads > 1 else None
        self._base: dict[str, np.ndarray] | None = None   # last published (publish dtype)
        self._base_version: int | None = None
        self._last_full: int | None = None

    def resume(self) -> int | None:
        """Adopt the newest committed version on disk as the delta base (after a restart)."""
        v = latest_version(self.dir)
        if v is None:
            return None
        self._base = WeightReceiver(self.dir).load_flat(v)
        self._base_version = v
        fulls = [u for u in committed_versions(self.dir) if u <= v and read_entry(self.dir, u)["kind"] == "full"]
        self._last_full = fulls[-1] if fulls else None
        return v

    def _map(self, fn, items):
        return list(self._pool.map(fn, items)) if self._pool is not None else [fn(i) for i in items]

    def publish(self, params: Any, version: int, *, flat: dict[str, np.ndarray] | None = None) -> PublishStats:
        """Publish `params` (pytree, or pre-flattened host arrays via `flat`) as `version`.

        Versions must increase. Re-publishing an existing version (a restarted trainer that
        recomputed a step) checks that the content is bit-identical and reuses it.
        """
        t0 = time.time()
        flat = cast_flat(flat if flat is not None else flatten_params(params), self.dtype)
        digest = params_digest(flat)
        full_bytes = nbytes(flat)
        name_json = f"{_vname(version)}.json"
        if self.dir.exists(name_json):
            entry = json.loads(self.dir.read(name_json))
            if entry["sha256_params"] != digest:
                raise IntegrityError(f"version {version} already published with different weights "
                                     f"(non-deterministic recompute after restart?)")
            self._base, self._base_version = flat, int(version)
            return PublishStats(version, "existing", 0, full_bytes, time.time() - t0)
        if self._base_version is not None and version <= self._base_version:
            raise ValueError(f"versions must increase: {version} <= last published {self._base_version}")
        full = (self._base is None or self._last_full is None
                or version - self._last_full >= self.full_every or list(self._base) != list(flat))
        kind = "full" if full else "delta"
        jobs = []
        for name, arr in flat.items():
            nbits = bits(arr)
            bbits = None if full else bits(self._base[name])
            for s in range(0, max(nbits.size, 1), self.shard_elems):
                jobs.append((name, nbits[s:s + self.shard_elems],
                             None if bbits is None else bbits[s:s + self.shard_elems]))
        blobs = self._map(lambda j: encode_shard(j[1], j[2], self._compress), jobs)
        leaves, offset, chunks = {}, 0, []
        for (name, shard, _), blob in zip(jobs, blobs):
            arr = flat[name]
            e = leaves.setdefault(name, dict(shape=list(arr.shape), dtype=arr.dtype.name, shards=[]))
            e["shards"].append([offset, len(blob), int(shard.size)])
            offset += len(blob)
            chunks.append(blob)
        data = b"".join(chunks)
        self.dir.write(f"{_vname(version)}.bin", data)
        entry = dict(version=int(version), kind=kind, base=None if full else int(self._base_version),
                     dtype=self.dtype, codec=self.codec, leaves=leaves, file_bytes=len(data),
                     full_bytes=full_bytes, sha256_file=hashlib.sha256(data).hexdigest(),
                     sha256_params=digest, time=time.time())
        self.dir.write(name_json, json.dumps(entry).encode())   # commit point
        self.dir.write("LATEST", str(int(version)).encode())
        self._base, self._base_version = flat, int(version)
        if full:
            self._last_full = int(version)
        self._prune_and_index()
        return PublishStats(int(version), kind, len(data), full_bytes, time.time() - t0)

    def _prune_and_index(self) -> None:
        vs = committed_versions(self.dir)
        entries = {v: read_entry(self.dir, v) for v in vs}
        fulls = [v for v in vs if entries[v]["kind"] == "full"]
        if len(fulls) > self.keep_fulls:
            cut = fulls[-self.keep_fulls]
            for v in [v for v in vs if v < cut]:
                for suffix in (".json", ".bin"):   # entry first: a reader never sees a json without its bin
                    self.dir.remove(f"{_vname(v)}{suffix}")
                entries.pop(v)
        summary = [dict(version=v, kind=e["kind"], base=e["base"], sha256_params=e["sha256_params"],
                        file_bytes=e["file_bytes"], full_bytes=e["full_bytes"]) for v, e in sorted(entries.items())]
        self.dir.write("manifest.json", json.dumps(summary, indent=1).encode())

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()


class AsyncPublisher:
    """`WeightPublisher` in a background thread: `submit` copies to host and returns at once."""

    def __init__(self, publisher: WeightPublisher):
        self.publisher = publisher
        self._ex = concurrent.futures.ThreadPoolExecutor(1)
        self._pending: list[concurrent.futures.Future] = []
        self.stats: list[PublishStats] = []

    def submit(self, params: Any, version: int) -> concurrent.futures.Future:
        flat = flatten_params(params)            # device->host copy (the only blocking part)
        fut = self._ex.submit(self.publisher.publish, None, version, flat=flat)
        fut.add_done_callback(lambda f: f.exception() is None and self.stats.append(f.result()))
        self._pending.append(fut)
        return fut

    def wait(self) -> None:
        for f in self._pending:
            f.result()
        self._pending.clear()

    def close(self) -> None:
        self.wait()
        self._ex.shutdown()
        self.publisher.close()


# ----------------------------------------------------------------------------- receiver
class WeightReceiver:
    """Rebuilds published versions from the delta chain, verifying sha256 (module docstring)."""

    def __init__(self, directory: str | pathlib.Path | UrlDir, *, verify: bool = True):
        self.dir = url_dir(directory)
        self.verify = verify
        self._flat: dict[str, np.ndarray] | None = None
        self._version: int | None = None
        self.bytes_read = 0

    @property
    def version(self) -> int | None:
        return self._version

    def latest_version(self) -> int | None:
        return latest_version(self.dir)

    def _apply(self, entry: dict, base: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        import ml_dtypes  # noqa: PLC0415

        _, decompress = compressor(entry["codec"], 0)
        v = entry["version"]
        try:
            data = self.dir.read(f"{_vname(v)}.bin")
        except FileNotFoundError as e:
            raise IntegrityError(f"version {v}: data file missing (pruned?)") from e
        if self.verify and hashlib.sha256(data).hexdigest() != entry["sha256_file"]:
            raise IntegrityError(f"version {v}: data file sha256 mismatch")
        self.bytes_read += len(data)
        out = {}
        for name, e in entry["leaves"].items():
            dt = np.dtype(ml_dtypes.bfloat16) if e["dtype"] == "bfloat16" else np.dtype(e["dtype"])
            udt = np.dtype(f"u{dt.itemsize}")
            bbits = None if base is None else bits(base[name])
            parts, start = [], 0
            for off, ln, n in e["shards"]:
                b = None if bbits is None else bbits[start:start + n]
                parts.append(decode_shard(data[off:off + ln], b, n, udt, decompress))
                start += n
            out[name] = np.concatenate(parts).view(dt).reshape(e["shape"])
        if self.verify and params_digest(out) != entry["sha256_params"]:
            raise IntegrityError(f"version {v}: rebuilt params sha256 mismatch")
        return out

    def load_flat(self, version: int | None = None) -> dict[str, np.ndarray]:
        """Host arrays (publish dtype) of `version` (default: latest)."""
        target = self.latest_version() if version is None else int(version)
        if target is None:
            raise FileNotFoundError(f"no published weights in {self.dir}")
        if self._version == target:
            return self._flat
        chain = [read_entry(self.dir, target)]
        while chain[-1]["kind"] == "delta" and chain[-1]["base"] != self._version:
            chain.append(read_entry(self.dir, chain[-1]["base"]))
        base = None if chain[-1]["kind"] == "full" else self._flat
        for entry in reversed(chain):
            base = self._apply(entry, None if entry["kind"] == "full" else base)
        self._flat, self._version = base, target
        return base

    def load(self, template: Any, version: int | None = None) -> tuple[Any, int]:
        """(params pytree shaped/typed like `template`, version); bf16 values are cast up."""
        flat = self.load_flat(version)
        return unflatten_like(flat, template), int(self._version)

    def wait_for(self, version: int, timeout_s: float, poll_s: float = 0.05) -> int:
        """Block until a version >= `version` is committed; returns the latest one."""
        t0 = time.time()
        while True:
            v = self.latest_version()
            if v is not None and v >= version:
                return v
            if time.time() - t0 > timeout_s:
                raise TimeoutError(f"no weights version >= {version} in {self.dir} after {timeout_s}s")
            time.sleep(poll_s)
