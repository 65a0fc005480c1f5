"""Continuous-batching rollout engine on the MLA latent cache (SPEC §1, §4, §4.1, §6; issue 24).

`sampler.generate` decodes one fixed batch: every row waits for the slowest, every call prefills
its prompts from scratch. The engine serves a stream of requests instead.

Slots and memory. The engine owns one latent cache ``transformer.init_cache(cfg, slots, max_len)``
(``c_kv`` + rope key per layer; the cache-memory budget is ``slots x max_len`` token positions,
`rl.sampler.engine_slots` / `engine_max_len`). A slot is *active* (decoding a request), *parked*
(holding the cache of an episode between its turns) or *free* (possibly still holding a finished
request's tokens, a prefix another request may reuse). Each cache row is a left-aligned sequence:
token t at slot position t, as in `generate` and the training forward.

Requests. A `Request` is (context token ids, per-sequence key, max_new, stop ids, temperature,
top_p, owner). Its generated token number g is drawn with ``fold_in(key, g)``
(`sampler.token_keys`), exactly as `generate` draws row i's token g from ``sequence_keys(key)[i]``:
a request whose key is ``fold_in(k, 0)`` samples what ``generate([context], k)`` samples, whatever
else the engine is serving (tested: continuous batching == one-at-a-time `generate`).

Budget policy: **queue**. Requests wait FIFO until a slot is obtainable; nothing is preempted. A
request takes, in order: its owner's parked slot; a free slot (least recently used); a parked slot
of another owner (LRU), whose cache is first swapped out to the park store (device arrays of the
cached length, at most `engine_park_tokens` positions in all; the least recently used entries are
dropped past that, and a dropped episode rebuilds from the longest common prefix of what is left).

Reuse (prefill only what no cache holds). On admission the engine finds, among the slots (not
assigned this round) and the park store, the cache whose tokens share the longest common prefix
(LCP) with the request's context, copies those cache rows into the target slot (no copy when it
is the target's own) and prefills only the rest, capped so that >= 1 token is prefilled (its
logits draw the first token). A hit in another slot or the store shorter than `engine_min_reuse`
tokens (random prompts sharing a first token) is prefilled instead: such a copy saves nothing and
each (pair count, window) shape of it is one more compile. Two cases this covers:

* Per-episode cache across turns: an episode's next context extends its cached tokens (context +
  every generated token, all fed, the stop token included), so a turn prefills only its new tokens
  (observation + turn header). A context rewrite (self-summary, compaction, sliding window) shares
  a shorter prefix with the cache: the engine rebuilds from that LCP. `Completion.prefill_tokens`
  counts what was computed, `reused_tokens` what was not.
* Shared prefixes: requests of one admission round with identical contexts (the G rollouts of a
  prompt) are prefilled once: the first (leader) is prefilled, the others copy its cache rows and
  draw their first token, each with its own key, from the leader's last logits (0 prefill tokens).

Chunked prefill. Prefill runs on a gathered sub-batch of slot rows in chunks of at most
`engine_prefill_chunk` tokens per row (all admitted rows advance together, one chunk per call),
over an attention window of the first W cache positions (W a compile bucket >= `engine_min_window`
covering the chunk: powers of two, and with `engine_window_per_octave` = 2, 4, ... that many even
steps per doubling, so a window is at most 1.5x / 1.25x the positions in use); pad tokens are
written past the window, i.e. nowhere (`transformer.decode` drops writes past the cache). Decode
likewise attends over a window covering the active rows' positions: its cost per step grows with W
(benchmarks/rollout_engine.py, docs/PERF.md).

Decode. One jitted `lax.while_loop` runs up to `sync_tokens` decode steps (`chunk_tokens` with a
`poll`) of every active slot per host round-trip, each step `sampler.decode_one` (the one decode
step `generate` runs), with stop detection on device (a stop id fed, or max_new tokens fed). The
loop leaves early when nothing is active or, while requests wait, as soon as `engine_refill_slots`
slots finished (1: at once), so freed slots take the next waiting requests without waiting for the
others (a larger value trades a little slot idle time for fewer prefill calls and host round-trips). Inactive slots feed
at a position past the window (nothing written), so parked caches are untouched.

Same contracts as `generate`. Logprobs are the untempered model's; ``router_indices[:, j]`` are the
experts that processed generated token j as an input (router replay); every token carries the
version of the weights that sampled it. With ``poll() -> (params, version)`` the engine polls at
every host round-trip (<= `chunk_tokens` decode steps) and switches weights in flight: ``kv_mode``
"keep" continues on the caches the old weights computed (parked ones included, PipelineRL);
"recompute" re-prefills every active row (context + generated tokens) with the new weights,
redraws each pending token with its own key and replaces the generated tokens' routing, and drops
every other cache.

Mesh (SPEC §2). Without a mesh (or a one-device one) the engine runs on the default device. A full
config whose `mesh` asks for several devices (`parallel.mesh.run_mesh`) runs it sharded, with the
placement `generate` uses on a mesh (`parallel.sharded`): weights placed by the one rules table
(`sharded.place_params`, once per polled version, not per step), the slot cache allocated with its
slot dim split over the batch axes (data x fsdp x expert; `sharded.sampling_cache_shardings`, the
latent dim also over ``context`` when it divides) and the per-slot decode state split likewise, the
jitted steps on the plain attention / MoE paths (`sharded.sampling_config`) partitioned by GSPMD.
Every step that writes the cache (prefill, decode loop, prefix copies, swap-ins) pins its output to
that layout (`sharded.constrain_sampling_cache`): only the rows a step reads or writes move between
devices (a prefill's or a copy's rows over its window, a swapped-out row's cached positions), never
the whole cache. A parked row in the swap store is one row, so it is not split (it lives where
GSPMD puts it, replicated over the batch ranks). The slot count must be a multiple of the batch
ranks (`validate_engine` names `rl.sampler.engine_slots` before a run starts; `Engine` raises a
one-line ValueError): the slots are the cache budget, so the engine does not silently round them up
as `generate` rounds a batch bucket. Host-side per-slot state (tokens, owners, queue, store index)
is the same as on one device, and so are the samples, up to reduction order (tests/rl/test_engine_mesh.py).

Replicas. ``rl.sampler.engine_replicas`` = n > 1 (no multi-device mesh) makes `make_engine` build
`EngineReplicas`: n independent engines, one per local device, each with ``slots / n`` slots, its own
weights copy (placed at each polled version) and cache, behind the same interface. A round-trip steps
every busy replica in its own host thread, so the devices run at once (the GIL is released while XLA
runs; on CPU each virtual device (``jax_num_cpu_devices``) computes on its own core, where one device's
small decode kernels leave the other core idle). Routing keeps reuse on one replica: an owner's requests
follow its cache, a context identical to one routed recently follows it (a group's prompt is prefilled
once), anything else goes to the least-loaded replica. Samples are those of one engine (per-sequence
keys; logprobs up to reduction order). Data-parallel replicas are how vLLM / SGLang scale an engine
over devices that each hold the model; a model too large for one device takes the mesh instead.

`EnginePolicy` adapts it to the agent: ``policy(contexts, max_new)`` (the batched interface, samples
equal `generate`'s with the same key; the toy env's groups, eval warm-up) and ``policy.stream()``,
with which `horizon.agent.run_episodes` advances episodes independently (an episode's tool call runs
as soon as its generation ends, in a bounded pool, while the engine decodes the others).

Who uses it: `rollout_policy(params_ref, cfg, key, ...)` is the one policy factory of every caller —
the sync RL loop and the async rollout workers (`rl.runtime.core.rollout_groups`, poll = the current
weights / `workers.WeightSource.poll`), the RL loop's held-out eval (`rl.runtime.loop.evaluate`) and
the eval harness (`eval.harness.policy_from_params`, experiments/eval.py). It always returns an
`EnginePolicy`, on one device or on the run's mesh; there is no lockstep policy (`sampler.generate`
stays the one fixed-batch sampler, e.g. for benchmarks and tests). Determinism: a group's samples do not depend on scheduling
(which slot, which batch-mates, when a tool call returned): an episode's turn t draws with its own
key ``fold_in(fold_in(stream key, episode), t)`` and the stream key is the policy key's next split,
i.e. a function of the batch's first slot (`core.policy_key`) and the call count (tested).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import threading
import time
from typing import Callable, Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from horizon.data.tokenizer import tokenizer_from_config
from horizon.model import transformer
from horizon.parallel import mesh as pmesh
from horizon.parallel import sharded
from horizon.utils.shapes import bucket  # the one compile-shape bucket (trainer rows, sampler batches)
from horizon.inference import sampler
from horizon.inference.config import EngineConfig, engine_config, resolve_engine_config

KV_MODES = sampler.KV_MODES
_NO_STOP = -1          # padding of a row's stop-id table (no token id is negative)


# ----------------------------------------------------------------------------------------- types
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


# ------------------------------------------------------------------------------ device functions
def _window(cache: dict, window: int) -> dict:
    return jax.tree.map(lambda a: a[:, :, :window], cache)


def _write_window(cache: dict, sub: dict, window: int) -> dict:
    return jax.tree.map(lambda a, s: a.at[:, :, :window].set(s), cache, sub)


@functools.partial(jax.jit, static_argnames=("cfg", "window", "mesh"), donate_argnames=("cache",))
def prefill_rows(params: dict, cache: dict, rows: Int[Array, " b"], tokens: Int[Array, "b c"],
                 start: Int[Array, " b"], count: Int[Array, " b"], *, cfg, window: int, mesh=None
                 ) -> tuple[dict, Float[Array, "b vocab"], Int[Array, "moe_layers b c k"]]:
    """One prefill chunk of cache rows `rows` (>= slots: padding, neither read nor written): row i's
    first ``count[i]`` `tokens` go to positions ``start[i] + j`` through `transformer.decode` over
    the first `window` positions (pad tokens at position `window`: not written). Returns (cache,
    logits of each row's last token [b, V], routing of every token [L_moe, b, c, k]). With a `mesh`
    the returned cache keeps the slot layout (`sharded.constrain_sampling_cache`)."""
    b, c = tokens.shape
    sub = jax.tree.map(lambda a: jnp.take(a[:, :, :window], rows, axis=1, mode="fill", fill_value=0), cache)
    j = jnp.arange(c, dtype=jnp.int32)[None]
    positions = jnp.where(j < count[:, None], start[:, None] + j, window)
    logits, sub, aux = transformer.decode(params, sub, tokens, positions, cfg=cfg,
                                          logits_at=jnp.maximum(count - 1, 0))
    cache = jax.tree.map(lambda a, s: a.at[:, rows, :window].set(s, mode="drop"), cache, sub)
    cache = sharded.constrain_sampling_cache(cache, mesh)
    ri = aux["router_indices"]
    return cache, logits[:, 0], ri.reshape(ri.shape[0], b, c, ri.shape[-1])


@jax.jit
def sample_rows(logits: Float[Array, "b vocab"], src: Int[Array, " f"], key_data: jax.Array,
                index: Int[Array, " f"], temperature: Float[Array, " f"], top_p: Float[Array, " f"]
                ) -> tuple[Int[Array, " f"], Float[Array, " f"]]:
    """Draw generated token number ``index[i]`` of request i from the logits row ``src[i]`` with
    ``fold_in(key i, index[i])`` (`sampler.token_keys`; a group's followers share their leader's row)."""
    keys = sampler.token_keys(jax.random.wrap_key_data(key_data), index)
    return sampler.sample_from_logits(jnp.take(logits, src, axis=0, mode="clip"), keys, temperature, top_p)


@functools.partial(jax.jit, static_argnames=("window", "mesh"), donate_argnames=("cache",))
def copy_rows(cache: dict, src: Int[Array, " f"], dst: Int[Array, " f"], *, window: int, mesh=None) -> dict:
    """The first `window` positions of cache rows `src` copied onto rows `dst` (all reads before any
    write; dst >= slots: skipped). Positions past the window are left as they are: a copied prefix is
    at most `window` long and a row's later positions are written before they are read. With a `mesh`
    only the copied rows' window moves between devices and the cache keeps the slot layout."""
    cache = jax.tree.map(lambda a: a.at[:, dst, :window].set(jnp.take(a[:, :, :window], src, axis=1, mode="clip"),
                                                            mode="drop"), cache)
    return sharded.constrain_sampling_cache(cache, mesh)


@functools.partial(jax.jit, static_argnames=("length",))
def extract_row(cache: dict, row: Int[Array, ""], *, length: int) -> dict:
    """The first `length` positions of cache row `row` (a swap-out to the park store; with a mesh only
    those positions of the row leave its device)."""
    return jax.tree.map(lambda a: jnp.take(a[:, :, :length], row, axis=1), cache)


@functools.partial(jax.jit, static_argnames=("mesh",), donate_argnames=("cache",))
def insert_row(cache: dict, row: Int[Array, ""], saved: dict, *, mesh=None) -> dict:
    """`saved` (an `extract_row` result) written back at the start of cache row `row` (the slot layout
    kept with a `mesh`)."""
    cache = jax.tree.map(lambda a, s: a.at[:, row, : s.shape[1]].set(s), cache, saved)
    return sharded.constrain_sampling_cache(cache, mesh)


@functools.partial(jax.jit, static_argnames=("cfg", "steps", "window", "mesh"), donate_argnames=("cache",))
def decode_loop(params: dict, cache: dict, state: dict, leave_after: Int[Array, ""], *, cfg, steps: int,
                window: int, mesh=None) -> tuple[dict, dict, dict]:
    """Up to `steps` decode steps of every slot on device (one `lax.while_loop`, one host sync).

    `state` per slot: ``tok`` (pending token, generated number ``gen``, to be fed at ``pos``), ``lp``
    (its logprob), ``max_new``, ``active``, ``key_data`` (the sequence key), ``temperature``,
    ``top_p``, ``stops`` [S, n] (-1 padded). Each step feeds every active slot's pending token
    (`sampler.decode_one`, recording it) and draws the next with ``fold_in(key, gen + 1)``; a slot
    finishes after feeding a stop id or its ``max_new``-th token. Leaves when nothing is active or,
    with `leave_after` > 0, once that many slots finished (to refill them). Returns (cache, state, outputs:
    ``tok``/``lp``/``fed`` [steps, S], ``ri`` [steps, L_moe, S, k], ``steps`` run). With a `mesh` the
    window carried through the loop and the returned cache keep the slot layout."""
    S = state["tok"].shape[0]
    c = transformer.model_cfg(cfg)
    L_moe = transformer.layer_counts(c)[1]
    k = c.num_experts_per_tok
    seq_keys = jax.random.wrap_key_data(state["key_data"])
    outs = {"tok": jnp.zeros((steps, S), jnp.int32), "lp": jnp.zeros((steps, S), jnp.float32),
            "fed": jnp.zeros((steps, S), bool), "ri": jnp.zeros((steps, L_moe, S, k), jnp.int32)}

    def cond(carry):
        i, _, st, finished, _ = carry
        return (i < steps) & jnp.any(st["active"]) & ~((leave_after > 0) & (finished >= leave_after))

    def body(carry):
        i, sub, st, finished, o = carry
        act = st["active"]
        keys = sampler.token_keys(seq_keys, st["gen"] + 1)
        pos = jnp.where(act, st["pos"], window)             # inactive: fed past the window, nothing written
        sub, nxt, nlp, ri = sampler.decode_one(params, sub, st["tok"], pos, keys, st["temperature"], st["top_p"], cfg)
        sub = sharded.constrain_sampling_cache(sub, mesh)
        o = {"tok": o["tok"].at[i].set(st["tok"]), "lp": o["lp"].at[i].set(st["lp"]),
             "fed": o["fed"].at[i].set(act), "ri": o["ri"].at[i].set(ri.reshape(L_moe, S, k))}
        hit = jnp.any(st["tok"][:, None] == st["stops"], axis=-1)
        fin = act & (hit | (st["gen"] + 1 >= st["max_new"]))
        go = act & ~fin
        st = dict(st, active=go, tok=jnp.where(go, nxt, st["tok"]), lp=jnp.where(go, nlp, st["lp"]),
                  pos=jnp.where(go, st["pos"] + 1, st["pos"]), gen=jnp.where(go, st["gen"] + 1, st["gen"]))
        return i + 1, sub, st, finished + jnp.sum(fin, dtype=jnp.int32), o

    sub = sharded.constrain_sampling_cache(_window(cache, window), mesh)
    i, sub, state, _, outs = jax.lax.while_loop(cond, body, (jnp.int32(0), sub, state, jnp.int32(0), outs))
    return sharded.constrain_sampling_cache(_write_window(cache, sub, window), mesh), state, dict(outs, steps=i)


# ------------------------------------------------------------------------------------ host side
def key_data(key: jax.Array) -> np.ndarray:
    """The raw bits of a key (typed ``jax.random.key`` or legacy ``PRNGKey``), as the device loop
    re-wraps them (`jax.random.wrap_key_data`, the default implementation)."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(key))
    return np.asarray(key)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays."""
    n = min(len(a), len(b))
    if n == 0 or a[0] != b[0]:          # the usual miss, without building the comparison arrays
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n


@dataclasses.dataclass
class _Seq:
    """An admitted request's host record."""

    rid: int
    req: Request
    ctx: np.ndarray
    key_data: np.ndarray
    stops: np.ndarray
    toks: list = dataclasses.field(default_factory=list)
    lps: list = dataclasses.field(default_factory=list)
    ris: list = dataclasses.field(default_factory=list)      # [L_moe, k] per generated token
    vers: list = dataclasses.field(default_factory=list)
    prefill: int = 0
    reused: int = 0


@dataclasses.dataclass
class _Slot:
    tokens: np.ndarray                   # ids whose latents the row holds at positions 0..len-1
    owner: Hashable | None = None
    seq: _Seq | None = None              # the active request
    used: int = 0                        # LRU clock


@dataclasses.dataclass
class _Job:
    """A prefill: `tokens` go to positions start.. of `slot`; `followers` copy the result."""

    seq: _Seq
    slot: int
    tokens: np.ndarray
    start: int
    index: int = 0                       # generated-token number the logits draw (recompute: m)
    followers: list = dataclasses.field(default_factory=list)   # (seq, slot)
    want_ri: bool = False
    ri: list = dataclasses.field(default_factory=list)


class _Serving:
    """`run`, shared by `Engine` and `EngineReplicas` (each defines `busy` and `step`)."""

    def run(self) -> list[Completion]:
        """Step until idle; the completions in finishing order."""
        out = []
        while self.busy:
            out += self.step()
        return out


class Engine(_Serving):
    """Continuous-batching generation over a fixed set of latent-cache slots (module docstring).

    `cfg` is the full config (model + `rl.sampler`) or a model config with `engine` an
    `EngineConfig`. Weights: fixed `params` (tagged `version`) or ``poll() -> (params, version)``.
    A full config whose `mesh` asks for several devices (`parallel.mesh.run_mesh`) runs the engine
    sharded (module docstring, "Mesh"): the slots must divide over the mesh's batch axes.
    `submit` queues a `Request` and returns its id; `step` runs one host round-trip (admission +
    prefill, then up to `sync_tokens` decode steps) and returns the requests that finished; `run`
    steps until every submitted request finished. `stats` counts prefill / reused / generated
    tokens, decode steps and host round-trips, weight switches, evictions.
    """

    def __init__(self, cfg, *, params: dict | None = None, poll: Callable[[], tuple[dict, int]] | None = None,
                 version: int = 0, engine: EngineConfig | None = None, stop_tokens: Sequence[int] | None = None,
                 device: jax.Device | None = None, **overrides):
        if (params is None) == (poll is None):
            raise ValueError("pass exactly one of params or poll")
        ec = resolve_engine_config(cfg, engine, overrides)
        if ec.replicas != 1:
            raise ValueError(f"an Engine is one replica; make_engine builds {ec.replicas} (rl.sampler.engine_replicas)")
        if ec.kv_mode not in KV_MODES:
            raise ValueError(f"kv_mode must be one of {KV_MODES}, got {ec.kv_mode!r}")
        for f in ("slots", "max_len", "prefill_chunk", "min_prefill_chunk", "sync_tokens", "min_window", "stop_slots",
                  "refill_slots", "min_reuse"):
            if getattr(ec, f) < 1:
                raise ValueError(f"engine {f} must be >= 1, got {getattr(ec, f)}")
        if ec.window_per_octave < 1 or ec.window_per_octave & (ec.window_per_octave - 1):
            raise ValueError(f"engine window_per_octave must be a power of two (1, 2, 4, ...), "
                             f"got {ec.window_per_octave}")
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
        S = ec.slots
        kd = np.asarray(jax.random.key_data(jax.random.key(0)))
        self.st = {"tok": np.zeros(S, np.int32), "lp": np.zeros(S, np.float32), "pos": np.zeros(S, np.int32),
                   "gen": np.zeros(S, np.int32), "max_new": np.zeros(S, np.int32), "active": np.zeros(S, bool),
                   "key_data": np.zeros((S,) + kd.shape, kd.dtype), "temperature": np.ones(S, np.float32),
                   "top_p": np.ones(S, np.float32), "stops": np.full((S, ec.stop_slots), _NO_STOP, np.int32)}
        self.pending_version = np.zeros(S, np.int64)     # version that drew each slot's pending token
        self.slots = [_Slot(np.zeros(0, np.int32)) for _ in range(S)]
        self.store: collections.OrderedDict = collections.OrderedDict()   # owner -> (tokens, saved rows)
        self.waiting: collections.deque = collections.deque()
        self.finished: list[Completion] = []
        self._next_rid = 0
        self._clock = 0
        self.stats = collections.Counter()

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
        if req.owner is not None and (any(s.owner == req.owner and s.seq is not None for s in self.slots)
                                      or any(q.req.owner == req.owner for q in self.waiting)):
            raise ValueError(f"owner {req.owner!r} already has a request in flight")
        table = np.full(self.ec.stop_slots, _NO_STOP, np.int32)
        table[: len(stops)] = stops
        rid = self._next_rid
        self._next_rid += 1
        self.waiting.append(_Seq(rid, req, ctx, key_data(req.key), table))
        return rid

    @property
    def busy(self) -> bool:
        """Requests waiting or decoding."""
        return bool(self.waiting) or any(s.seq is not None for s in self.slots)

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
        for s in self.slots:
            if s.owner == owner and s.seq is None:
                s.owner = None
        self.store.pop(owner, None)

    # -- placement -------------------------------------------------------------------------------
    def _place(self, params: dict) -> dict:
        """Weights in the mesh's layout (`sharded.place_params`; once per polled version), on the engine's
        `device` (a replica, `make_engine`), else as they are."""
        if self.mesh is not None:
            return sharded.place_params(params, self.cfg, self.mesh)
        return params if self.device is None else jax.device_put(params, self.device)

    def _init_cache(self) -> dict:
        """The slot cache ``[L, slots, max_len, r]`` per leaf, allocated in place: on the default device (or
        the replica's `device`), or with a mesh split over its batch axes on the slot dim
        (`sharded.sampling_cache_shardings`). The steps run where the cache and weights are committed."""
        make = functools.partial(transformer.init_cache, self.mcfg, self.ec.slots, self.ec.max_len)
        if self.device is not None:
            return jax.jit(make, out_shardings=jax.sharding.SingleDeviceSharding(self.device))()
        if self.mesh is None:
            return make()
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
        each active row (context + fed tokens) and redraw its pending token (module docstring)."""
        self.store.clear()
        jobs = []
        for i, s in enumerate(self.slots):
            if s.seq is None:
                s.tokens, s.owner = np.zeros(0, np.int32), None
                continue
            toks = s.tokens
            jobs.append(_Job(s.seq, i, toks, 0, index=int(self.st["gen"][i]), want_ri=True))
            self.stats["recompute_tokens"] += len(toks)
        self._run_prefill(jobs, count=False)
        for j in jobs:
            ri = np.concatenate(j.ri, axis=1) if j.ri else np.zeros((self.L_moe, 0, self.k), np.int32)
            n, m = len(j.seq.ctx), len(j.seq.toks)
            for g in range(m):
                j.seq.ris[g] = ri[:, n + g]

    # -- admission -------------------------------------------------------------------------------
    def _window_for(self, n: int) -> int:
        """The attention window (a compile bucket >= `min_window`, `window_per_octave` per doubling)
        covering positions ``0..n-1``: attention and the cache window cost scale with it."""
        return bucket(n, self.ec.min_window, per_octave=self.ec.window_per_octave)

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _pick_slot(self, owner, taken: set) -> int | None:
        """The slot a request of `owner` takes (queue policy, module docstring) or None (wait)."""
        idle = [i for i, s in enumerate(self.slots) if s.seq is None and i not in taken]
        mine = [i for i in idle if owner is not None and self.slots[i].owner == owner]
        if mine:
            return mine[0]
        free = [i for i in idle if self.slots[i].owner is None]
        if free:
            return min(free, key=lambda i: self.slots[i].used)
        if idle:
            victim = min(idle, key=lambda i: self.slots[i].used)
            self._swap_out(victim)
            return victim
        return None

    def _swap_out(self, i: int) -> None:
        s = self.slots[i]
        n = len(s.tokens)
        self.stats["evictions"] += 1
        if 0 < n <= self.ec.park_tokens:
            while self.store and sum(len(t) for t, _ in self.store.values()) + n > self.ec.park_tokens:
                self.store.popitem(last=False)
                self.stats["store_drops"] += 1
            saved = extract_row(self.cache, jnp.int32(i), length=n)
            self.store[s.owner] = (s.tokens, saved)
        s.owner, s.tokens = None, np.zeros(0, np.int32)

    def _best_source(self, ctx: np.ndarray, target: int, taken: set):
        """(kind, where, lcp) of the cache sharing the longest prefix with `ctx`: ("slot", i) among
        slots not assigned this round (the target's own included), or ("store", owner)."""
        best = ("none", None, 0)
        for i, s in enumerate(self.slots):
            if (i in taken and i != target) or len(s.tokens) == 0:
                continue
            n = common_prefix(s.tokens, ctx)
            if n > best[2] or (n == best[2] and n > 0 and i == target):
                best = ("slot", i, n)
        for owner, (toks, _) in self.store.items():
            n = common_prefix(toks, ctx)
            if n > best[2]:
                best = ("store", owner, n)
        return best

    def _admit(self) -> None:
        """Assign waiting requests to slots (FIFO, queue policy) and prefill them (module docstring)."""
        if not self.waiting:
            return
        taken: set = set()
        copies, inserts, jobs, leaders = [], [], [], {}
        while self.waiting:
            seq = self.waiting[0]
            owner = seq.req.owner
            i = self._pick_slot(owner, taken)
            if i is None:
                break
            self.waiting.popleft()
            taken.add(i)
            slot = self.slots[i]
            slot.owner, slot.seq, slot.used = owner, seq, self._tick()
            key = seq.ctx.tobytes()
            if key in leaders:                                      # identical context this round
                leaders[key].followers.append((seq, i))
                slot.tokens = seq.ctx
                seq.reused = len(seq.ctx)
                self.stats["reused_tokens"] += seq.reused
                continue
            kind, where, lcp = self._best_source(seq.ctx, i, taken)
            lcp = min(lcp, len(seq.ctx) - 1)                        # >= 1 token prefilled: its logits draw
            if lcp < self.ec.min_reuse and not (kind == "slot" and where == i):
                lcp = 0                  # a short hit elsewhere: prefilling it beats a copy (and its compile)
            if lcp > 0 and kind == "slot" and where != i:
                copies.append((where, i, lcp))
            elif lcp > 0 and kind == "store":
                inserts.append((i, self.store[where][1]))
                if where == owner:
                    self.store.pop(where)
            seq.reused = lcp
            self.stats["reused_tokens"] += lcp
            slot.tokens = seq.ctx
            job = _Job(seq, i, seq.ctx[lcp:], lcp)
            jobs.append(job)
            leaders[key] = job
        if copies:                           # reads before any write of this round (a source may be a
            self._copy(copies)               # target further down the queue): copies, inserts, prefill
        for i, saved in inserts:
            self.cache = insert_row(self.cache, jnp.int32(i), saved, mesh=self.mesh)
        self._run_prefill(jobs, count=True)
        follow = [(j.slot, i, len(j.seq.ctx)) for j in jobs for _, i in j.followers]
        if follow:
            self._copy(follow)

    def _copy(self, pairs: list) -> None:
        """Copy (src slot, dst slot, prefix length) triples: the pair count padded to a power of two and
        the positions to a window covering the longest prefix (compile buckets, as prefill's)."""
        S = self.ec.slots
        b = bucket(len(pairs), 1)
        src = np.zeros(b, np.int32)
        dst = np.full(b, S, np.int32)                          # padding pairs: dst >= slots, skipped
        for r, (a, d, _) in enumerate(pairs):
            src[r], dst[r] = a, d
        window = min(self.ec.max_len, self._window_for(max(n for _, _, n in pairs)))
        self.cache = copy_rows(self.cache, jnp.asarray(src), jnp.asarray(dst), window=window, mesh=self.mesh)

    def _run_prefill(self, jobs: list, *, count: bool) -> None:
        """Prefill `jobs` in chunks (all rows advance together), then draw each request's pending
        token (followers from their leader's logits) and activate the slots."""
        todo = list(jobs)
        S, C_max = self.ec.slots, self.ec.prefill_chunk
        while todo:
            b = bucket(len(todo), 1)
            c = min(C_max, bucket(max(len(j.tokens) for j in todo), self.ec.min_prefill_chunk))
            rows = np.full(b, S, np.int32)
            toks = np.zeros((b, c), np.int32)
            start = np.zeros(b, np.int32)
            cnt = np.zeros(b, np.int32)
            for r, j in enumerate(todo):
                n = min(c, len(j.tokens))
                rows[r], start[r], cnt[r] = j.slot, j.start, n
                toks[r, :n] = j.tokens[:n]
            window = min(self.ec.max_len, self._window_for(int((start + cnt).max())))
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
        st = self.st
        K = self.ec.sync_tokens
        act = st["active"]
        window = min(self.ec.max_len, self._window_for(int(st["pos"][act].max()) + K))
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
        self.stats["round_trips"] += 1
        for k_ in ("tok", "lp", "pos", "gen", "active"):
            st[k_] = np.array(new[k_])
        fed = outs["fed"][:steps]
        for i in np.flatnonzero(fed.any(axis=0)):
            s = self.slots[i]
            seq = s.seq
            rows = np.flatnonzero(fed[:, i])
            toks = outs["tok"][rows, i]
            seq.toks.extend(toks.tolist())
            seq.lps.extend(outs["lp"][rows, i].tolist())
            seq.ris.extend(outs["ri"][r, :, i] for r in rows)
            seq.vers.extend([int(self.pending_version[i])] + [self.version] * (len(rows) - 1))
            self.pending_version[i] = self.version
            s.tokens = np.concatenate([s.tokens, toks.astype(np.int32)])
            self.stats["generated_tokens"] += len(rows)
            if not st["active"][i]:
                self._complete(i)

    def _complete(self, i: int) -> None:
        s = self.slots[i]
        seq, s.seq, s.used = s.seq, None, self._tick()
        m = len(seq.toks)
        toks = np.asarray(seq.toks, np.int32)
        ri = np.stack(seq.ris, axis=1) if m else np.zeros((self.L_moe, 0, self.k), np.int32)
        self.finished.append(Completion(
            request_id=seq.rid, tokens=toks, logprobs=np.asarray(seq.lps, np.float32), router_indices=ri,
            versions=np.asarray(seq.vers, np.int32), stopped=bool(m and np.isin(toks[-1], seq.stops[seq.stops >= 0])),
            prefill_tokens=seq.prefill, reused_tokens=seq.reused))


def generate_requests(engine: "Engine | EngineReplicas", requests: Sequence[Request]) -> list[Completion]:
    """Submit `requests`, run the engine until they finish; their completions in request order."""
    ids = [engine.submit(r) for r in requests]
    got = {c.request_id: c for c in engine.run()}
    return [got[i] for i in ids]


# --------------------------------------------------------------------------------- replicas
class EngineReplicas(_Serving):
    """`n` data-parallel `Engine` replicas, one per local device, serving one request stream (as
    vLLM's data-parallel engines do): ``rl.sampler.engine_replicas`` (module docstring, "Replicas").

    Same interface as `Engine` (`submit`, `step`, `run`, `busy`, `release`, `stats`, `ec`). Each
    replica owns ``slots / n`` slots, its weights and its cache on its device; `step` runs every busy
    replica's round-trip in its own host thread, so the devices compute at once (on CPU, each device
    runs its kernels on its own core: docs/PERF.md). Routing keeps what reuse needs on one replica:
    an owner's requests go where its cache is (per-episode caches across turns), a context identical
    to one routed earlier goes with it (a group prefills its prompt once), anything else to the
    replica with the fewest requests (ties: the lowest index). Samples do not depend on the routing
    (per-sequence keys); `stats` sums the replicas' counters (``switches``: the most any made)."""

    def __init__(self, cfg, *, params: dict | None = None, poll: Callable[[], tuple[dict, int]] | None = None,
                 version: int = 0, engine: EngineConfig | None = None, stop_tokens: Sequence[int] | None = None,
                 **overrides):
        ec = resolve_engine_config(cfg, engine, overrides)
        n, devices = ec.replicas, jax.local_devices()
        if n < 2:
            raise ValueError(f"EngineReplicas needs engine replicas >= 2, got {n} (make_engine builds one Engine)")
        if n > len(devices):
            raise ValueError(f"engine replicas={n} need {n} local devices, this process has {len(devices)} (on CPU: "
                             f"jax.config.update('jax_num_cpu_devices', {n}) before JAX starts, or "
                             f"XLA_FLAGS=--xla_force_host_platform_device_count={n})")
        if ec.slots % n:
            raise ValueError(f"engine slots={ec.slots} must be a multiple of engine replicas={n}")
        if pmesh.run_mesh(cfg) is not None:
            raise ValueError("engine replicas > 1 and a multi-device mesh do not combine: use one or the other")
        self.ec = ec
        one = dataclasses.replace(ec, replicas=1, slots=ec.slots // n)
        self.engines = [Engine(cfg, params=params, poll=poll, version=version, engine=one, stop_tokens=stop_tokens,
                               device=d) for d in devices[:n]]
        self.stop_tokens = self.engines[0].stop_tokens
        self._pool = concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="engine-replica")
        self._rid: dict[tuple[int, int], int] = {}            # (replica, its id there) -> request id
        self._owner: dict[Hashable, int] = {}                 # owner -> replica holding its cache
        self._ctx: collections.OrderedDict = collections.OrderedDict()   # recent context bytes -> replica
        self._next_rid = 0

    @property
    def busy(self) -> bool:
        return any(e.busy for e in self.engines)

    @property
    def stats(self) -> collections.Counter:
        out = sum((e.stats for e in self.engines), collections.Counter())
        out["switches"] = max(e.stats["switches"] for e in self.engines)
        return out

    def _route(self, req: Request, ctx: bytes) -> int:
        if req.owner is not None and req.owner in self._owner:
            return self._owner[req.owner]
        if ctx in self._ctx:
            return self._ctx[ctx]
        load = collections.Counter(r for r, _ in self._rid)      # requests submitted and not finished
        return min(range(len(self.engines)), key=lambda r: (load[r], r))

    def submit(self, req: Request) -> int:
        """Queue `req` on its replica (validated there, now); returns its request id."""
        ctx = np.asarray(req.context, np.int32).reshape(-1).tobytes()
        r = self._route(req, ctx)
        local = self.engines[r].submit(req)
        if req.owner is not None:
            self._owner[req.owner] = r
        self._ctx[ctx] = r
        self._ctx.move_to_end(ctx)
        while len(self._ctx) > self.ec.slots:
            self._ctx.popitem(last=False)
        rid = self._next_rid
        self._next_rid += 1
        self._rid[(r, local)] = rid
        return rid

    def step(self) -> list[Completion]:
        """One round-trip of every busy replica, concurrently; the requests that finished."""
        busy = [r for r, e in enumerate(self.engines) if e.busy]
        futs = {r: self._pool.submit(self.engines[r].step) for r in busy}
        out = []
        for r in busy:
            for c in futs[r].result():
                rid = self._rid.pop((r, c.request_id))
                out.append(dataclasses.replace(c, request_id=rid))
        return out

    def release(self, owner: Hashable) -> None:
        """Forget `owner`'s cache on its replica."""
        r = self._owner.pop(owner, None)
        if r is not None:
            self.engines[r].release(owner)


def make_engine(cfg, *, engine: EngineConfig | None = None, **kwargs) -> "Engine | EngineReplicas":
    """The rollout engine `cfg` asks for: one `Engine`, or `EngineReplicas` when ``engine_replicas`` > 1
    (`engine` / keyword overrides as `Engine` takes them)."""
    ec_fields = {f.name for f in dataclasses.fields(EngineConfig)}
    ec = resolve_engine_config(cfg, engine, {k: kwargs.pop(k) for k in list(kwargs) if k in ec_fields})
    return (Engine if ec.replicas == 1 else EngineReplicas)(cfg, engine=ec, **kwargs)
