"""The rollout engine's static sizes (`EngineConfig`), read from a config's `rl.sampler` section,
and that section's validation (docs/ARCHITECTURE.md, "inference")."""

from __future__ import annotations

import dataclasses
import math

from horizon.data.tokenizer import tokenizer_from_config
from horizon.model import layers, transformer
from horizon.parallel import mesh as pmesh
from horizon.utils.config import need, need_int


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Static engine sizes (`engine_config` reads them from `rl.sampler`)."""

    slots: int                 # decode slots (rows of the latent cache)
    max_len: int               # positions per slot (cache budget = slots * max_len)
    prefill_chunk: int         # max prefill tokens per row per call
    min_prefill_chunk: int     # smallest chunk (power-of-two buckets from it up to prefill_chunk)
    sync_tokens: int           # decode steps per host round-trip
    min_window: int            # smallest attention window (compile buckets above it: `window_per_octave`)
    park_tokens: int           # swap store budget for evicted parked caches (positions)
    stop_slots: int            # max stop ids per request (the device stop table's width)
    refill_slots: int = 1      # while requests wait, leave the decode loop once this many slots finished
    kv_mode: str = "keep"
    window_per_octave: int = 1  # attention-window buckets per doubling: 1 = powers of two, 2 adds the 1.5x midpoints
    min_reuse: int = 1         # shortest prefix copied from another slot or the swap store (shorter: prefilled)
    replicas: int = 1          # data-parallel engine replicas, one per local device (`make_engine`); slots in all
    min_prefill_rows: int = 1  # smallest row bucket of a prefill call (powers of two up to slots)


def engine_config(cfg, **overrides) -> EngineConfig:
    """`EngineConfig` from a full config's `rl.sampler` section (configs/rl_tiny.py); `engine_max_len`
    0 = `model.max_seq_len`, `engine_park_tokens` < 0 = slots x max_len. `overrides` replace fields."""
    if "rl" not in cfg or "sampler" not in cfg.rl:
        raise ValueError("the rollout engine needs the config's rl.sampler section (configs/rl_tiny.py) "
                         "or an EngineConfig (engine=)")
    s = cfg.rl.sampler
    max_len = int(s.engine_max_len) or int(transformer.model_cfg(cfg).max_seq_len)
    slots = int(s.engine_slots)
    park = int(s.engine_park_tokens)
    ec = dict(slots=slots, max_len=max_len, prefill_chunk=int(s.engine_prefill_chunk),
              min_prefill_chunk=int(s.engine_min_prefill_chunk),
              sync_tokens=int(s.sync_tokens), min_window=int(s.engine_min_window),
              park_tokens=slots * max_len if park < 0 else park, stop_slots=int(s.engine_stop_slots),
              refill_slots=int(s.engine_refill_slots), kv_mode=str(s.kv_mode),
              window_per_octave=int(s.get("engine_window_per_octave", 1)),
              min_reuse=int(s.get("engine_min_reuse", 1)), replicas=int(s.get("engine_replicas", 1)),
              min_prefill_rows=int(s.get("engine_min_prefill_rows", 1)))
    ec.update(overrides)
    return EngineConfig(**ec)


def resolve_engine_config(cfg, engine: EngineConfig | None, overrides: dict) -> EngineConfig:
    """`engine` (default: `engine_config(cfg)`) with `overrides` replaced: what every engine kind runs with."""
    return dataclasses.replace(engine, **overrides) if engine is not None else engine_config(cfg, **overrides)


ENGINE_COUNTS = ("engine_slots", "engine_prefill_chunk", "engine_min_prefill_chunk", "engine_min_window",
                 "engine_stop_slots", "engine_refill_slots")   # rl.sampler fields that must be >= 1


def pop_engine_fields(kwargs: dict) -> dict:
    """Remove and return the `EngineConfig` fields among `kwargs` (what is left is the caller's own)."""
    names = {f.name for f in dataclasses.fields(EngineConfig)}
    return {k: kwargs.pop(k) for k in list(kwargs) if k in names}


BACKENDS = ("engine", "remote")


def validate_backend(s) -> None:
    """`rl.sampler.backend` and, for "remote", its endpoint fields (`remote.RemotePolicy`, docs/SERVING.md)."""
    pre = "rl.sampler"
    backend = str(s.get("backend", "engine"))
    need(backend in BACKENDS, f"{pre}.backend", backend, f"must be one of {BACKENDS}")
    if backend != "remote":
        return
    url = s.get("base_url", "")
    need(isinstance(url, str) and url.startswith(("http://", "https://")), f"{pre}.base_url", url,
         "must be an http(s) URL of an OpenAI-compatible API root, e.g. http://127.0.0.1:8000/v1")
    need_int(s, "remote_concurrency", pre, lo=1)
    need_int(s, "remote_retries", pre, lo=0)
    need(float(s.get("remote_timeout_s", 0)) > 0, f"{pre}.remote_timeout_s", s.get("remote_timeout_s"), "must be > 0")


def validate_numerics(s) -> None:
    """`rl.sampler.compute_dtype` and `router_noise` (`sampler.sampler_numerics`)."""
    dt = str(s.get("compute_dtype", "") or "")
    need(dt == "" or dt in layers.DTYPES, "rl.sampler.compute_dtype", dt,
         f"must be '' (the model's dtype) or one of {sorted(layers.DTYPES)}")
    noise = s.get("router_noise", 0.0)
    need(isinstance(noise, (int, float)) and float(noise) >= 0, "rl.sampler.router_noise", noise,
         "must be a number >= 0 (0 = no noise)")


def validate_engine(c) -> None:
    """`rl.sampler`'s `engine_*` fields (`engine_config`, docs/SPEC.md §4; the rollout engine is every caller's
    sampler): sizes >= 1, a slot count that divides over the engine replicas
    (`engine_replicas`, 1 with a multi-device mesh) and over the data-parallel
    ranks of the config's mesh (a buildable one, `mesh.validate_mesh`; the slot cache is split over
    them, `engine.Engine`), a smallest prefill chunk
    within the largest, a refill count within the slots, a slot length (`engine_max_len`, 0 =
    `model.max_seq_len`) within the model's that holds a whole agent context (`agent.max_context_tokens`:
    a turn's context + its generation; not for the async toy env), a stop table wide enough for the
    tokenizer's stop ids, and a swap store of >= 0 positions (-1 = slots x max_len). A sampler section
    without engine fields: nothing to check."""
    s, pre = c.rl.sampler, "rl.sampler"
    validate_backend(s)
    validate_numerics(s)
    if "engine_slots" not in s:
        return
    for k in ENGINE_COUNTS:
        need_int(s, k, pre, lo=1)
    if "engine_window_per_octave" in s:
        wpo = need_int(s, "engine_window_per_octave", pre, lo=1, hi=64)
        need(wpo & (wpo - 1) == 0, f"{pre}.engine_window_per_octave", wpo, "must be a power of two (1, 2, 4, ...)")
    if "engine_min_reuse" in s:
        need_int(s, "engine_min_reuse", pre, lo=1)
    if "engine_min_prefill_rows" in s:
        need_int(s, "engine_min_prefill_rows", pre, lo=1, hi=int(s.engine_slots))
    replicas = need_int(s, "engine_replicas", pre, lo=1) if "engine_replicas" in s else 1
    need(int(s.engine_slots) % replicas == 0, f"{pre}.engine_slots", s.engine_slots,
         f"must be a multiple of {pre}.engine_replicas={replicas} (each replica holds slots / replicas)")
    if "mesh" in c:        # every caller validates the mesh this way too; first, so its error is the one shown
        pmesh.validate_mesh(c, power_of_two_ranks=True)
        nb = math.prod(pmesh.mesh_sizes(c.mesh)[a] for a in pmesh.BATCH_AXES)
        need(int(s.engine_slots) % nb == 0, f"{pre}.engine_slots", s.engine_slots,
             f"must be a multiple of the mesh's {nb} data-parallel ranks (data*fsdp*expert): "
             "the slot cache is split over them")
        need(replicas == 1 or math.prod(pmesh.mesh_sizes(c.mesh).values()) == 1, f"{pre}.engine_replicas", replicas,
             "must be 1 with a multi-device mesh (the engine runs sharded over it; replicas are one device each)")
    max_seq = int(c.model.max_seq_len)
    max_len = need_int(s, "engine_max_len", pre, lo=0, hi=max_seq) or max_seq
    need(int(s.engine_min_prefill_chunk) <= int(s.engine_prefill_chunk), f"{pre}.engine_min_prefill_chunk",
         s.engine_min_prefill_chunk, f"must be <= {pre}.engine_prefill_chunk={s.engine_prefill_chunk}")
    need(int(s.engine_refill_slots) <= int(s.engine_slots), f"{pre}.engine_refill_slots", s.engine_refill_slots,
         f"must be <= {pre}.engine_slots={s.engine_slots}")
    need_int(s, "engine_park_tokens", pre, lo=-1)
    stops = len(tokenizer_from_config(c).stop_ids)
    need(int(s.engine_stop_slots) >= stops, f"{pre}.engine_stop_slots", s.engine_stop_slots,
         f"must hold the tokenizer's {stops} stop ids")
    toy = "async_" in c and str(c.async_.env) == "toy"       # no agent episodes (workers.toy_rollout)
    if "agent" in c and not toy:
        ctx = int(c.agent.max_context_tokens)
        need(max_len >= ctx, f"{pre}.engine_max_len", s.engine_max_len,
             f"a slot ({max_len} positions) must hold agent.max_context_tokens={ctx}")
