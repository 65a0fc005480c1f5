"""Async data paths (docs/SPEC.md §4.1): fsspec storage vs Ray's object store, and the delta codec.

Uses a finished `experiments/rl_async.py` run (default runs/rl_async_tiny/async): its written
groups and its published weight versions (real training steps of configs/rl_async_tiny.py, whose
model is configs/rl_tiny.py's).

1. Transfer: a group record, a published weights version of the run and a full version of a
   larger model (`--big-config`, its init), written by this process and read by another (a Ray
   actor), through (a) `storage.GroupStore` / `weight_sync` on a local directory via fsspec
   (`UrlDir`; also the raw bytes without the codec) and (b) `ray.put` here + `ray.get` in the actor.
   Median of `--repeat`.
2. Codec: for every pair of consecutive versions, the byte-shuffled XOR delta compressed with zlib
   and zstd at several levels: bytes (as a fraction of the raw version) and compress / decompress
   time. On the run's published bf16 versions, and on versions this script trains itself
   (`--train-steps` steps of `runtime.train_groups` on the run's groups from the run's warm start,
   published in bfloat16 and float32).

    python benchmarks/transfer.py --run runs/rl_async_tiny/async
"""

from __future__ import annotations

import argparse
import pathlib
import pickle
import statistics
import tempfile

import numpy as np

from horizon.rl.runtime import storage
from horizon.rl.runtime import weight_sync as ws
from horizon.utils import progress, provenance, timing
from horizon.utils.config import load_config_file
from horizon.utils.files import UrlDir

MIB = 2**20
LEVELS = {"xor_zlib": [1, 6, 9], "xor_zstd": [1, 3, 9, 19]}


def timed(fn, repeat: int) -> tuple[float, object]:
    """(median seconds, last output) of `repeat` calls of fn() (`horizon.utils.timing.timed`, no warm-up)."""
    out, ts = timing.timed(fn, 0, repeat)
    return statistics.median(ts), out


class Reader:
    """A Ray actor in its own process: reads from storage or resolves object refs."""

    def read_group(self, root: str, slot: int) -> int:
        return storage.GroupStore(root).get(slot).generated_tokens

    def read_weights(self, root: str, version: int) -> int:
        return sum(a.nbytes for a in ws.WeightReceiver(root).load_flat(version).values())

    def read_raw(self, root: str, name: str) -> int:
        return len(pickle.loads(UrlDir(root).read(name)))

    def resolve(self, refs: list) -> int:
        import ray  # noqa: PLC0415

        x = ray.get(refs[0])
        return len(x) if isinstance(x, dict) else 1


def model_flat(config: str, dtype: str) -> dict[str, np.ndarray]:
    """The init params of `config`'s model, cast to the publish dtype (a full version's payload)."""
    from horizon.model.params import numpy_init  # noqa: PLC0415

    return ws.cast_flat(ws.flatten_params(numpy_init(load_config_file(config).model, 0)), dtype)


def row(payload: str, path: str, tw: float, tr: float) -> None:
    print(f"| {payload} | {path} | {1e3 * tw:.2f} | {1e3 * tr:.2f} |")


def time_group(reader, rec, tmp: str, repeat: int) -> None:
    import ray  # noqa: PLC0415

    n = [0]

    def put():
        n[0] += 1
        rec.slot = 10_000 + n[0]
        storage.GroupStore(f"{tmp}/groups").put(rec)
        return rec.slot
    tw, s = timed(put, repeat)
    tr, _ = timed(lambda: ray.get(reader.read_group.remote(f"{tmp}/groups", s)), repeat)
    row("group", "fsspec local dir (`GroupStore`)", tw, tr)
    tw, ref = timed(lambda: ray.put(rec), repeat)
    tr, _ = timed(lambda: ray.get(reader.resolve.remote([ref])), repeat)
    row("group", "Ray object store", tw, tr)


def time_weights(reader, label: str, flat: dict, dtype: str, codec: str, level: int, tmp: str, repeat: int) -> None:
    import ray  # noqa: PLC0415

    n = [0]

    def publish():
        n[0] += 1
        d = f"{tmp}/weights_{label}_{n[0]}"
        ws.WeightPublisher(d, dtype=dtype, codec=codec, level=level, num_threads=1).publish(None, 0, flat=flat)
        return d
    tw, d = timed(publish, repeat)
    tr, _ = timed(lambda: ray.get(reader.read_weights.remote(d, 0)), repeat)
    row(label, f"fsspec local dir (`WeightPublisher` full, {codec}-{level}, sha256)", tw, tr)
    raw = UrlDir(f"{tmp}/raw_{label}")
    tw, _ = timed(lambda: raw.write("flat.pkl", pickle.dumps(flat, protocol=pickle.HIGHEST_PROTOCOL)), repeat)
    tr, _ = timed(lambda: ray.get(reader.read_raw.remote(raw.url, "flat.pkl")), repeat)
    row(label, "fsspec local dir (raw pickled arrays, no codec)", tw, tr)
    tw, ref = timed(lambda: ray.put(flat), repeat)
    tr, _ = timed(lambda: ray.get(reader.resolve.remote([ref])), repeat)
    row(label, "Ray object store (raw arrays)", tw, tr)


def transfer(run: pathlib.Path, big_config: str, codec: str, level: int, repeat: int, tmp: str) -> None:
    import ray  # noqa: PLC0415

    src = storage.GroupStore(run / "groups")
    rec = src.get(src.ready_slots()[0])
    rx = ws.WeightReceiver(run / "weights")
    v = rx.latest_version()
    flat, dtype = rx.load_flat(v), ws.read_entry(run / "weights", v)["dtype"]
    big = model_flat(big_config, dtype)
    g_mb = len(pickle.dumps(rec, protocol=pickle.HIGHEST_PROTOCOL)) / MIB
    print(f"group record: {g_mb:.3f} MiB pickled ({rec.generated_tokens} tokens); run's weights version {v}: "
          f"{ws.nbytes(flat) / MIB:.2f} MiB {dtype}; {big_config} init: {ws.nbytes(big) / MIB:.1f} MiB {dtype}")
    store_mb = max(256, int(4 * ws.nbytes(big) / MIB))
    ray.init(num_cpus=2, object_store_memory=store_mb * MIB, include_dashboard=False, _temp_dir=f"{tmp}/ray",
             configure_logging=False, log_to_driver=False)
    try:
        reader = ray.remote(num_cpus=0)(Reader).remote()
        ray.get(reader.resolve.remote([ray.put({})]))       # actor up, imports done
        print("| payload | path | write ms | read in another process ms |")
        print("|---|---|---|---|")
        time_group(reader, rec, tmp, repeat)
        time_weights(reader, "run weights", flat, dtype, codec, level, tmp, repeat)
        time_weights(reader, pathlib.Path(big_config).stem, big, dtype, codec, level, tmp, repeat)
    finally:
        ray.shutdown()


def train_versions(run: pathlib.Path, config: str, steps: int, tmp: str) -> dict[str, str]:
    """Publish versions 0..`steps` of `steps` real RL steps (`runtime.train_groups` on the run's
    groups, slot order, from `async_.init_from`) in bfloat16 and float32; {dtype: weights dir}."""
    from horizon.rl.runtime import async_setup, core  # noqa: PLC0415

    cfg = load_config_file(config)
    N = int(cfg.rl.prompts_per_step)
    store = storage.GroupStore(run / "groups")
    state, ckpt, _ = core.resume_rl_state(async_setup.initial_params(cfg), cfg, f"{tmp}/ckpt")
    dirs = {d: f"{tmp}/trained_{d}" for d in ws.DTYPES}
    pubs = {d: ws.WeightPublisher(p, dtype=d, full_every=steps + 1, num_threads=1) for d, p in dirs.items()}
    for step in progress.progress(range(steps + 1), desc="train and publish versions", unit="version"):
        for p in pubs.values():
            p.publish(state.params, step)
        if step < steps:
            state, m, _ = core.train_groups(state, [store.get(s) for s in range(step * N, (step + 1) * N)], cfg)
            progress.say(f"trained step {step + 1}: loss {m['loss']:.4f} grad_norm {m['grad_norm']:.3f}")
    ckpt.close()
    return dirs


def codecs(d: str | pathlib.Path, levels: dict[str, list[int]], repeat: int) -> None:
    vs = ws.committed_versions(d)
    rx = ws.WeightReceiver(d)
    flats = [rx.load_flat(v) for v in vs]
    pairs = [(a, b) for a, b, va, vb in zip(flats, flats[1:], vs, vs[1:]) if vb == va + 1]
    if not pairs:
        raise SystemExit(f"{d}: no two consecutive versions")
    raw = ws.nbytes(flats[0])
    print(f"\ncodec on {len(pairs)} real deltas (consecutive versions {vs[0]}..{vs[-1]} of {d}, "
          f"{raw / MIB:.2f} MiB raw {flats[0][next(iter(flats[0]))].dtype} each):")
    print("| codec | level | delta / raw | compress ms | decompress ms |")
    print("|---|---|---|---|---|")
    settings = [(codec, level) for codec, lv in levels.items() for level in lv]
    for codec, level in progress.progress(settings, desc="codec settings", unit="setting"):
        comp, decomp = ws.compressor(codec, level)
        sizes, tc, td = [], [], []
        for a, b in pairs:
            shards = [(ws.bits(b[k]), ws.bits(a[k])) for k in b]
            t, blobs = timed(lambda comp=comp, shards=shards: [ws.encode_shard(n, o, comp) for n, o in shards],
                             repeat)
            tc.append(t)
            sizes.append(sum(map(len, blobs)))
            t, _ = timed(lambda decomp=decomp, blobs=blobs, shards=shards: [
                ws.decode_shard(x, o, n.size, n.dtype, decomp) for x, (n, o) in zip(blobs, shards)], repeat)
            td.append(t)
        progress.say(f"| {codec} | {level} | {np.mean(sizes) / raw:.4f} | {1e3 * np.mean(tc):.2f} | "
                     f"{1e3 * np.mean(td):.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="runs/rl_async_tiny/async")
    ap.add_argument("--config", default="configs/rl_async_tiny.py", help="the run's config (trained versions)")
    ap.add_argument("--big-config", default="configs/small.py", help="a larger model for the transfer table")
    ap.add_argument("--train-steps", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    provenance.announce(config=vars(a))
    run = pathlib.Path(a.run)
    if not (run / "groups").is_dir() or not (run / "weights").is_dir():
        raise SystemExit(f"{run}: no groups/ and weights/ (run experiments/rl_async.py first)")
    cfg = load_config_file(a.config).async_
    with tempfile.TemporaryDirectory(prefix="horizon_transfer_") as tmp:
        transfer(run, a.big_config, str(cfg.codec), int(cfg.codec_level), a.repeat, tmp)
        codecs(run / "weights", LEVELS, a.repeat)
        if a.train_steps > 0:
            for d in train_versions(run, a.config, a.train_steps, tmp).values():
                codecs(d, LEVELS, a.repeat)


if __name__ == "__main__":
    main()
