"""The rollout engine (docs/SPEC.md §1, §4, §4.1, §6): continuous batching of generation requests over a
fixed set of latent-cache slots, an episode's cache kept across its turns.

`Engine` is the host loop: it queues `Request`s, admits them to slots (`slots.SlotTable`: queue
policy, prefix reuse, park store), prefills only what no cache holds and decodes every active slot
in device chunks (`device`), switching weights in flight. A request samples what
`sampler.generate` samples for it alone with the same key, whatever else the engine serves.
Several devices: a mesh (here) or data-parallel replicas (`replicas`). Design: docs/INFERENCE.md.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable, Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Float, Int

from horizon.data.tokenizer import tokenizer_from_config
from horizon.inference import sampler
from horizon.inference.config import EngineConfig, resolve_engine_config
from horizon.inference.device import (
    NO_STOP,
    chunk_bucket,
    copy_rows,
    decode_loop,
    extract_row,
    init_slot_state,
    insert_row,
    key_data,
    prefill_rows,
    rows_bucket,
    sample_rows,
    window_for,
)
from horizon.inference.slots import Job, Seq, Slot, SlotTable
from horizon.model import transformer
from horizon.parallel import mesh as pmesh
from horizon.parallel import sharded

_POSITIVE = ("slots", "max_len", "prefill_chunk", "min_prefill_chunk", "sync_tokens", "min_window", "stop_slots",
             "refill_slots", "min_reuse", "min_prefill_rows")            # EngineConfig fields that must be >= 1


@dataclasses.dataclass
class Request:
    """One generation: continue `context` (int token ids) by at most `max_new` tokens.

    `key` is the sequence's own key (token g drawn with ``fold_in(key, g)``): a typed key, or its raw
    key data (`jax.random.key_data`, e.g. a numpy row; no device call per request); `stop_ids` default to
    the model tokenizer's; `owner` (an episode) keeps its cache in the engine between its requests
    until `Engine.release(owner)`.
    """

    context: Int[np.ndarray, " n"]
    key: jax.Array | np.ndarray
    max_new: int
    stop_ids: Sequence[int] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    owner: Hashable | None = None


@dataclasses.dataclass
class Completion:
    """A finished request: generated tokens (stop token included when one was drawn), untempered
    logprobs, routing [L_moe, m, k] of each token as an input, weight version per token, whether a
    stop id ended it, and its prefill: tokens computed and cached tokens reused."""

    request_id: int
    tokens: Int[np.ndarray, " m"]
    logprobs: Float[np.ndarray, " m"]
    router_indices: Int[np.ndarray, "moe_layers m k"]
    versions: Int[np.ndarray, " m"]
    stopped: bool
    prefill_tokens: int
    reused_tokens: int


class Serving:
    """`run`, shared by `Engine` and `replicas.EngineReplicas` (each defines `busy` and `step`)."""

    def run(self) -> list[Completion]:
        """Step until idle; the completions in finishing order."""
        out = []
        while self.busy:
            out += self.step()
        return out


def generate_requests(engine: Serving, requests: Sequence[Request]) -> list[Completion]:
    """Submit `requests`, run the engine until they finish; their completions in request order."""
    ids = [engine.submit(r) for r in requests]
    got = {c.request_id: c for c in engine.run()}
    return [got[i] for i in ids]


def _check_sizes(ec: EngineConfig) -> None:
    """One-line errors for sizes an `Engine` cannot run with (`config.validate_engine` names the
    config fields before a run)."""
    if ec.replicas != 1:
        raise ValueError(f"an Engine is one replica; make_engine builds {ec.replicas} (rl.sampler.engine_replicas)")
    if ec.kv_mode not in sampler.KV_MODES:
        raise ValueError(f"kv_mode must be one of {sampler.KV_MODES}, got {ec.kv_mode!r}")
    for f in _POSITIVE:
        if getattr(ec, f) < 1:
            raise ValueError(f"engine {f} must be >= 1, got {getattr(ec, f)}")
    if ec.window_per_octave < 1 or ec.window_per_octave & (ec.window_per_octave - 1):
        raise ValueError(f"engine window_per_octave must be a power of two (1, 2, 4, ...), "
                         f"got {ec.window_per_octave}")


class Engine(Serving):
    """Continuous-batching generation over a fixed set of latent-cache slots (docs/INFERENCE.md).

    `cfg` is the full config (model + `rl.sampler`) or a model config with `engine` an
    `EngineConfig`. Weights: fixed `params` (tagged `version`) or ``poll() -> (params, version)``.
    A full config whose `mesh` asks for several devices (`parallel.mesh.run_mesh`) runs the engine
    sharded: the slots must divide over the mesh's batch axes. `device` pins it to one device (a
    replica). `submit` queues a `Request` and returns its id; `step` runs one host round-trip
    (admission + prefill, then up to `sync_tokens` decode steps) and returns the requests that
    finished; `run` steps until every submitted request finished. `stats` counts prefill / reused /
    generated tokens, decode steps and host round-trips, weight switches, evictions.
    """

    def __init__(self, cfg, *, params: dict | None = None, poll: Callable[[], tuple[dict, int]] | None = None,
                 version: int = 0, engine: EngineConfig | None = None, stop_tokens: Sequence[int] | None = None,
                 device: jax.Device | None = None, **overrides):
        if (params is None) == (poll is None):
            raise ValueError("pass exactly one of params or poll")
        ec = resolve_engine_config(cfg, engine, overrides)
        _check_sizes(ec)
        self.ec = ec
        self.mesh = pmesh.run_mesh(cfg)
        if self.mesh is not None and device is not None:
            raise ValueError("an Engine runs on a mesh or on one device, not both")
        self.device = device
        if self.mesh is not None:
            nb = pmesh.axis_size(self.mesh, pmesh.BATCH_AXES)
            if ec.slots % nb:
                raise ValueError(f"engine slots={ec.slots} must be a multiple of the mesh's {nb} data-parallel "
                                 f"ranks (rl.sampler.engine_slots): the slot cache is split over them")
            cfg = sharded.sampling_config(cfg)            # decode on the plain attention / MoE paths
        self.cfg = cfg
        self.mcfg = sampler.frozen_model_cfg(cfg)
        if ec.max_len > self.mcfg.max_seq_len:
            raise ValueError(f"engine max_len={ec.max_len} exceeds model.max_seq_len={self.mcfg.max_seq_len}")
        tok = tokenizer_from_config(cfg)
        self.stop_tokens = tuple(tok.stop_ids if stop_tokens is None else stop_tokens)
        self._poll = poll
        params, version = (params, version) if poll is None else poll()
        self.params, self.version = self._place(params), int(version)
        self.cache = self._init_cache()
        self.L_moe = transformer.layer_counts(self.mcfg)[1]
        self.k = int(self.mcfg.num_experts_per_tok)
        self.st = init_slot_state(ec.slots, ec.stop_slots)   # host copy of the decode loop's per-slot state
        self.pending_version = np.zeros(ec.slots, np.int64)  # version that drew each slot's pending token
        self.stats = collections.Counter()
        self.table = SlotTable(ec.slots, ec.park_tokens, ec.min_reuse, self.stats)
        self.waiting: collections.deque = collections.deque()
        self.finished: list[Completion] = []
        self._next_rid = 0

    @property
    def slots(self) -> list[Slot]:
        return self.table.slots

    # -- public API ------------------------------------------------------------------------------
    def submit(self, req: Request) -> int:
        """Queue `req` (validated now); returns its request id."""
        ctx = np.asarray(req.context, np.int32).reshape(-1)
        n, V = len(ctx), int(self.mcfg.vocab_size)
        if n < 1:
            raise ValueError("every context needs at least one token")
        if req.max_new < 1:
            raise ValueError(f"max_new must be >= 1, got {req.max_new}")
        if n + req.max_new > self.ec.max_len:
            raise ValueError(f"context ({n}) + max_new ({req.max_new}) exceeds the engine's max_len={self.ec.max_len}")
        if ((ctx < 0) | (ctx >= V)).any():
            raise ValueError(f"context token ids must be in [0, {V})")
        if not 0.0 < req.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {req.top_p}")
        stops = tuple(self.stop_tokens if req.stop_ids is None else req.stop_ids)
        if len(stops) > self.ec.stop_slots:
            raise ValueError(f"{len(stops)} stop ids > engine stop_slots={self.ec.stop_slots}")
        if req.owner is not None and (self.table.in_flight(req.owner)
                                      or any(q.req.owner == req.owner for q in self.waiting)):
            raise ValueError(f"owner {req.owner!r} already has a request in flight")
        table = np.full(self.ec.stop_slots, NO_STOP, np.int32)
        table[: len(stops)] = stops
        rid = self._next_rid
        self._next_rid += 1
        self.waiting.append(Seq(rid, req, ctx, key_data(req.key), table))
        return rid

    @property
    def busy(self) -> bool:
        """Requests waiting or decoding."""
        return bool(self.waiting) or self.table.active

    def step(self) -> list[Completion]:
        """One host round-trip: poll weights, admit waiting requests (prefill), decode a chunk."""
        self._maybe_switch()
        self._admit()
        if self.st["active"].any():
            self._decode()
        out, self.finished = self.finished, []
        return out

    def release(self, owner: Hashable) -> None:
        """Forget `owner`'s cache: its parked slot becomes free (its tokens stay a reusable prefix)."""
        self.table.release(owner)

    def drop_idle(self) -> None:
        """Forget every cache no request is decoding (reusable prefixes, parked episodes): a server
        does this when it loads other weights, so no later request reuses the old weights' cache."""
        self.table.drop_idle()

    def in_flight(self) -> dict[int, tuple[list, list]]:
        """request id -> (tokens, log-probs) generated so far, of every decoding request (a server's
        stream reads them after each `step`)."""
        return {s.seq.rid: (s.seq.toks, s.seq.lps) for s in self.slots if s.seq is not None}

    # -- placement -------------------------------------------------------------------------------
    def _place(self, params: dict) -> dict:
        """Weights in the mesh's layout (`sharded.place_params`; once per polled version), on the engine's
        `device` (a replica, `replicas.make_engine`), else as they are."""
        if self.mesh is not None:
            return sharded.place_params(params, self.cfg, self.mesh)
        return jax.device_put(params, self._home())

    def _home(self) -> jax.Device:
        """The one device the engine runs on without a mesh. Weights and cache are committed to it
        from the start, so every jitted call sees the same placements and compiles once per shape
        (an uncommitted first cache would give the first call its own executable)."""
        return self.device if self.device is not None else jax.devices()[0]

    def _init_cache(self) -> dict:
        """The slot cache ``[L, slots, max_len, r]`` per leaf, allocated in place: on the default device (or
        the replica's `device`), or with a mesh split over its batch axes on the slot dim
        (`sharded.sampling_cache_shardings`). The steps run where the cache and weights are committed."""
        make = functools.partial(transformer.init_cache, self.mcfg, self.ec.slots, self.ec.max_len)
        if self.device is not None:
            return jax.jit(make, out_shardings=jax.sharding.SingleDeviceSharding(self.device))()
        if self.mesh is None:
            return jax.device_put(make(), self._home())
        return jax.jit(make, out_shardings=sharded.sampling_cache_shardings(jax.eval_shape(make), self.mesh))()

    # -- weights ---------------------------------------------------------------------------------
    def _maybe_switch(self) -> None:
        if self._poll is None:
            return
        params, version = self._poll()
        if int(version) == self.version:
            return
        self.params, self.version = self._place(params), int(version)
        self.stats["switches"] += 1
        if self.ec.kv_mode == "recompute":
            self._recompute()

    def _recompute(self) -> None:
        """kv_mode="recompute": every cache was computed by old weights. Drop the idle ones; re-prefill
        each active row (context + fed tokens) and redraw its pending token (docs/INFERENCE.md)."""
        self.table.drop_idle()
        jobs = []
        for i, s in enumerate(self.slots):
            if s.seq is not None:
                jobs.append(Job(s.seq, i, s.tokens, 0, index=int(self.st["gen"][i]), want_ri=True))
                self.stats["recompute_tokens"] += len(s.tokens)
        self._run_prefill(jobs, count=False)
        for j in jobs:
            ri = np.concatenate(j.ri, axis=1) if j.ri else np.zeros((self.L_moe, 0, self.k), np.int32)
            n, m = len(j.seq.ctx), len(j.seq.toks)
            for g in range(m):
                j.seq.ris[g] = ri[:, n + g]

    # -- admission and prefill -------------------------------------------------------------------
    def _admit(self) -> None:
        """Assign waiting requests to slots (`SlotTable.admit`) and run the plan: prefix copies and
        swap-ins first (all reads before this round's writes), then the prefills, then the copies of
        each leader's cache to its followers."""
        if not self.waiting:
            return
        plan = self.table.admit(self.waiting, self._extract)
        if plan.copies:
            self._copy(plan.copies)
        for i, saved in plan.inserts:
            self.cache = insert_row(self.cache, jnp.int32(i), saved, mesh=self.mesh)
        self._run_prefill(plan.jobs, count=True)
        follow = [(j.slot, i, len(j.seq.ctx)) for j in plan.jobs for _, i in j.followers]
        if follow:
            self._copy(follow)

    def _extract(self, i: int, n: int) -> dict:
        """Slot `i`'s first `n` cache positions (a swap-out to the park store), read as the window
        bucket that covers them (one compile per window; positions past `n` are written again
        before they are read, as after `_copy`)."""
        return extract_row(self.cache, jnp.int32(i), length=window_for(n, self.ec))

    def _copy(self, pairs: list) -> None:
        """Copy (src slot, dst slot, prefix length) triples: the pairs padded to `slots` (a copy moves
        data and computes nothing, so one row count costs no time and saves compiles) and the
        positions to the window covering the longest prefix (prefill's buckets)."""
        S = self.ec.slots
        src = np.zeros(S, np.int32)
        dst = np.full(S, S, np.int32)                          # padding pairs: dst >= slots, skipped
        for r, (a, d, _) in enumerate(pairs):
            src[r], dst[r] = a, d
        window = window_for(max(n for _, _, n in pairs), self.ec)
        self.cache = copy_rows(self.cache, jnp.asarray(src), jnp.asarray(dst), window=window, mesh=self.mesh)

    def _run_prefill(self, jobs: list, *, count: bool) -> None:
        """Prefill `jobs` in chunks (all rows advance together), then draw each request's pending
        token (followers from their leader's logits) and activate the slots."""
        todo = list(jobs)
        S = self.ec.slots
        while todo:
            b = rows_bucket(len(todo), self.ec)
            c = chunk_bucket(max(len(j.tokens) for j in todo), self.ec)
            rows = np.full(b, S, np.int32)
            toks = np.zeros((b, c), np.int32)
            start = np.zeros(b, np.int32)
            cnt = np.zeros(b, np.int32)
            for r, j in enumerate(todo):
                n = min(c, len(j.tokens))
                rows[r], start[r], cnt[r] = j.slot, j.start, n
                toks[r, :n] = j.tokens[:n]
            window = window_for(int((start + cnt).max()), self.ec)
            self.cache, logits, ri = prefill_rows(self.params, self.cache, jnp.asarray(rows), jnp.asarray(toks),
                                                  jnp.asarray(start), jnp.asarray(cnt), cfg=self.mcfg, window=window,
                                                  mesh=self.mesh)
            if any(j.want_ri for j in todo):
                ri_h = np.asarray(ri)
                for r, j in enumerate(todo):
                    if j.want_ri:
                        j.ri.append(ri_h[:, r, : cnt[r]])
            done, rest = [], []
            for r, j in enumerate(todo):
                n = int(cnt[r])
                if count:
                    j.seq.prefill += n
                    self.stats["prefill_tokens"] += n
                j.tokens, j.start = j.tokens[n:], j.start + n
                (rest if len(j.tokens) else done).append((r, j))
            if done:
                self._draw_first(logits, done)
            todo = [j for _, j in rest]

    def _draw_first(self, logits, done: list) -> None:
        """Draw the pending token of every request whose prefill ended in this call (leaders from their
        own logits row, followers from their leader's) and activate their slots."""
        who = [(r, j.seq, j.slot, j.index) for r, j in done]
        who += [(r, f, i, 0) for r, j in done for f, i in j.followers]
        pad = self.ec.slots - len(who)                           # one compile: always `slots` draws
        src = np.array([w[0] for w in who] + [0] * pad, np.int32)
        kd = np.stack([w[1].key_data for w in who] + [who[0][1].key_data] * pad)
        idx = np.array([w[3] for w in who] + [0] * pad, np.int32)
        temp = np.array([w[1].req.temperature for w in who] + [1.0] * pad, np.float32)
        tp = np.array([w[1].req.top_p for w in who] + [1.0] * pad, np.float32)
        tok, lp = sample_rows(logits, jnp.asarray(src), jnp.asarray(kd), jnp.asarray(idx), jnp.asarray(temp),
                              jnp.asarray(tp))
        tok, lp = np.asarray(tok), np.asarray(lp)
        st = self.st
        for n, (_, seq, i, index) in enumerate(who):
            st["tok"][i], st["lp"][i] = tok[n], lp[n]
            st["pos"][i] = len(self.slots[i].tokens)
            st["gen"][i] = index
            st["max_new"][i] = seq.req.max_new
            st["active"][i] = True
            st["key_data"][i] = seq.key_data
            st["temperature"][i], st["top_p"][i] = seq.req.temperature, seq.req.top_p
            st["stops"][i] = seq.stops
            self.pending_version[i] = self.version

    # -- decode ----------------------------------------------------------------------------------
    def _decode(self) -> None:
        """One `decode_loop` chunk of every active slot; record what each fed, finish the ended ones."""
        st = self.st
        K = self.ec.sync_tokens
        act = st["active"]
        window = window_for(int(st["pos"][act].max()) + K, self.ec)
        if self.mesh is None:
            dev = jax.device_put(dict(st), self.device)           # one transfer call for the whole state
        else:                                                     # per-slot state split like the slots
            dev = sharded.place_sampling_rows(dict(st), self.mesh)
        leave = min(self.ec.refill_slots, len(self.waiting))      # 0: nobody waits, run the chunk out
        self.cache, new, outs = decode_loop(self.params, self.cache, dev, jnp.int32(leave),
                                            cfg=self.mcfg, steps=K, window=window, mesh=self.mesh)
        outs, new = jax.device_get((outs, new))
        steps = int(outs["steps"])
        self.stats["decode_steps"] += steps
        self.stats["slot_steps"] += steps * self.ec.slots      # occupancy = generated_tokens / slot_steps
        self.stats["round_trips"] += 1
        for k_ in ("tok", "lp", "pos", "gen", "active"):
            st[k_] = np.array(new[k_])
        fed = outs["fed"][:steps]
        for i in np.flatnonzero(fed.any(axis=0)):
            self._record(i, np.flatnonzero(fed[:, i]), outs)
            if not st["active"][i]:
                self._complete(i)

    def _record(self, i: int, rows: np.ndarray, outs: dict) -> None:
        """Slot `i` fed the tokens of decode steps `rows`: append them (logprobs, routing, versions) to
        its request and its slot's cached tokens."""
        s = self.slots[i]
        seq = s.seq
        toks = outs["tok"][rows, i]
        seq.toks.extend(toks.tolist())
        seq.lps.extend(outs["lp"][rows, i].tolist())
        seq.ris.extend(outs["ri"][r, :, i] for r in rows)
        seq.vers.extend([int(self.pending_version[i])] + [self.version] * (len(rows) - 1))
        self.pending_version[i] = self.version
        s.tokens = np.concatenate([s.tokens, toks.astype(np.int32)])
        self.stats["generated_tokens"] += len(rows)

    def _complete(self, i: int) -> None:
        seq = self.table.finish(i)
        m = len(seq.toks)
        toks = np.asarray(seq.toks, np.int32)
        ri = np.stack(seq.ris, axis=1) if m else np.zeros((self.L_moe, 0, self.k), np.int32)
        self.finished.append(Completion(
            request_id=seq.rid, tokens=toks, logprobs=np.asarray(seq.lps, np.float32), router_indices=ri,
            versions=np.asarray(seq.vers, np.int32), stopped=bool(m and np.isin(toks[-1], seq.stops[seq.stops >= 0])),
            prefill_tokens=seq.prefill, reused_tokens=seq.reused))
