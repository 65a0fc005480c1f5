"""Async data paths (SPEC §4.1, issue 23): fsspec storage vs Ray's object store, and the delta codec.

Uses a finished `experiments/rl_async.py` run (default runs/rl_async_tiny/async): its written
groups and its published weight versions (real training steps).

1. Transfer: one group record and one full weights version, written by this process and read by
   another (a Ray actor), through (a) `storage.GroupStore` / `weight_sync` on a local directory
   via fsspec (`UrlDir`) and (b) `ray.put` here + `ray.get` in the actor. Median of `--repeat`.
2. Codec: for every pair of consecutive published versions, the byte-shuffled XOR delta compressed
   with zlib and zstd at several levels: bytes (as a fraction of the raw version) and compress /
   decompress time.

    python benchmarks/transfer.py --run runs/rl_async_tiny/async
"""

from __future__ import annotations

import argparse
import pathlib
import pickle
import statistics
import tempfile
import time

import numpy as np

from horizon.rl.runtime import storage
from horizon.rl.runtime import weight_sync as ws


def timed(fn, repeat: int) -> tuple[float, object]:
    out, ts = None, []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), out


class Reader:
    """A Ray actor in its own process: reads from storage or resolves object refs."""

    def read_group(self, root: str, slot: int) -> int:
        return storage.GroupStore(root).get(slot).generated_tokens

    def read_weights(self, root: str, version: int) -> int:
        return sum(a.nbytes for a in ws.WeightReceiver(root).load_flat(version).values())

    def resolve(self, refs: list) -> int:
        import ray  # noqa: PLC0415

        x = ray.get(refs[0])
        return len(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL))


def transfer(run: pathlib.Path, repeat: int) -> None:
    import ray  # noqa: PLC0415

    src = storage.GroupStore(run / "groups")
    slot = src.ready_slots()[0]
    rec = src.get(slot)
    rx = ws.WeightReceiver(run / "weights")
    v = rx.latest_version()
    flat = rx.load_flat(v)
    entry = ws.read_entry(run / "weights", v)
    g_mb = len(pickle.dumps(rec, protocol=pickle.HIGHEST_PROTOCOL)) / 2**20
    w_mb = sum(a.nbytes for a in flat.values()) / 2**20
    tmp = tempfile.mkdtemp(prefix="horizon_transfer_")
    ray.init(num_cpus=2, object_store_memory=256 << 20, include_dashboard=False, _temp_dir=f"{tmp}/ray",
             configure_logging=False, log_to_driver=False)
    try:
        reader = ray.remote(num_cpus=0)(Reader).remote()
        ray.get(reader.read_group.remote(str(run / "groups"), slot))       # actor up, imports done
        print(f"group record: {g_mb:.3f} MiB pickled ({rec.generated_tokens} tokens); weights version {v}: "
              f"{w_mb:.2f} MiB ({entry['dtype']})")
        print("| payload | path | write ms | read in another process ms |")
        print("|---|---|---|---|")
        n = [0]

        def put_group():
            n[0] += 1
            dst = storage.GroupStore(f"{tmp}/groups")
            rec.slot = 10_000 + n[0]
            dst.put(rec)
            return rec.slot
        tw, s = timed(put_group, repeat)
        tr, _ = timed(lambda: ray.get(reader.read_group.remote(f"{tmp}/groups", s)), repeat)
        print(f"| group | fsspec local dir | {1e3 * tw:.2f} | {1e3 * tr:.2f} |")
        tw, ref = timed(lambda: ray.put(rec), repeat)
        tr, _ = timed(lambda: ray.get(reader.resolve.remote([ref])), repeat)
        print(f"| group | Ray object store | {1e3 * tw:.2f} | {1e3 * tr:.2f} |")

        def publish_full():
            n[0] += 1
            pub = ws.WeightPublisher(f"{tmp}/weights_{n[0]}", dtype=entry["dtype"], num_threads=1)
            pub.publish(None, 0, flat=flat)
            return f"{tmp}/weights_{n[0]}"
        tw, d = timed(publish_full, repeat)
        tr, _ = timed(lambda: ray.get(reader.read_weights.remote(d, 0)), repeat)
        print(f"| weights (full, xor_zlib) | fsspec local dir | {1e3 * tw:.2f} | {1e3 * tr:.2f} |")
        tw, ref = timed(lambda: ray.put(flat), repeat)
        tr, _ = timed(lambda: ray.get(reader.resolve.remote([ref])), repeat)
        print(f"| weights (raw arrays) | Ray object store | {1e3 * tw:.2f} | {1e3 * tr:.2f} |")
    finally:
        ray.shutdown()


def codecs(run: pathlib.Path, levels: dict[str, list[int]], repeat: int) -> None:
    d = run / "weights"
    vs = ws.committed_versions(d)
    rx = ws.WeightReceiver(d)
    flats = [rx.load_flat(v) for v in vs]
    pairs = [(a, b) for a, b, va, vb in zip(flats, flats[1:], vs, vs[1:]) if vb == va + 1]
    if not pairs:
        raise SystemExit(f"{d}: no two consecutive versions")
    raw = sum(x.nbytes for x in flats[0].values())
    print(f"\ncodec on {len(pairs)} real deltas (consecutive versions {vs[0]}..{vs[-1]} of {d}, "
          f"{raw / 2**20:.2f} MiB raw {flats[0][next(iter(flats[0]))].dtype} each):")
    print("| codec | level | delta / raw | compress ms | decompress ms |")
    print("|---|---|---|---|---|")
    for codec, lv in levels.items():
        for level in lv:
            comp, decomp = ws.compressor(codec, level)
            sizes, tc, td = [], [], []
            for a, b in pairs:
                shards = [(ws.bits(b[k]), ws.bits(a[k])) for k in b]
                t, blobs = timed(lambda: [ws.encode_shard(n, o, comp) for n, o in shards], repeat)
                tc.append(t)
                sizes.append(sum(map(len, blobs)))
                t, _ = timed(lambda: [ws.decode_shard(x, o, n.size, n.dtype, decomp)
                                      for x, (n, o) in zip(blobs, shards)], repeat)
                td.append(t)
            print(f"| {codec} | {level} | {np.mean(sizes) / raw:.4f} | {1e3 * np.mean(tc):.2f} | "
                  f"{1e3 * np.mean(td):.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="runs/rl_async_tiny/async")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    run = pathlib.Path(a.run)
    if not (run / "groups").is_dir() or not (run / "weights").is_dir():
        raise SystemExit(f"{run}: no groups/ and weights/ (run experiments/rl_async.py first)")
    transfer(run, a.repeat)
    codecs(run, {"xor_zlib": [1, 6, 9], "xor_zstd": [1, 3, 9, 19]}, a.repeat)


if __name__ == "__main__":
    main()
