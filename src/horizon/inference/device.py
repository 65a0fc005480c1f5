"""The rollout engine's jitted device functions (docs/SPEC.md §1, §4): chunked prefill of cache rows,
first-token draws, prefix copies, park-store swaps and the multi-step decode loop.

Kept apart from the host-side `engine.Engine` so what compiles (and on which shapes) is in one
place: every function takes its sizes as static compile buckets (`window_for`). With a mesh each
step that writes the slot cache pins it to the slot layout. Design: docs/INFERENCE.md.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from horizon.inference import sampler
from horizon.inference.config import EngineConfig
from horizon.model import transformer
from horizon.parallel import sharded
from horizon.utils.shapes import bucket

NO_STOP = -1          # padding of a row's stop-id table (no token id is negative)


def window_for(n: int, ec: EngineConfig) -> int:
    """The attention window covering positions ``0..n-1``: a compile bucket >= `min_window`
    (`window_per_octave` steps per doubling), at most `max_len`. Attention and cache-window cost
    scale with it (docs/INFERENCE.md, "Chunked prefill")."""
    return min(ec.max_len, bucket(n, ec.min_window, per_octave=ec.window_per_octave))


def rows_bucket(n: int, ec: EngineConfig) -> int:
    """Rows of a prefill call for `n` requests: a power of two >= `min_prefill_rows`
    (padding rows are neither read nor written)."""
    return bucket(n, ec.min_prefill_rows)


def chunk_bucket(n: int, ec: EngineConfig) -> int:
    """Prefill chunk for rows of at most `n` new tokens: a power of two >= `min_prefill_chunk`, at
    most `prefill_chunk`."""
    return min(ec.prefill_chunk, bucket(n, ec.min_prefill_chunk))


def cache_window(cache: dict, width: int) -> dict:
    """The first `width` positions of every cache row."""
    return jax.tree.map(lambda a: a[:, :, :width], cache)


def write_cache_window(cache: dict, sub: dict, width: int) -> dict:
    """`sub` (a `cache_window` of `cache`) written back over the first `width` positions."""
    return jax.tree.map(lambda a, s: a.at[:, :, :width].set(s), cache, sub)


def key_data(key: jax.Array) -> np.ndarray:
    """The raw bits of a key (typed ``jax.random.key`` or legacy ``PRNGKey``), as the device loop
    re-wraps them (`jax.random.wrap_key_data`, the default implementation)."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(key))
    return np.asarray(key)


def init_slot_state(slots: int, stop_slots: int) -> dict:
    """The host copy of `decode_loop`'s per-slot state, every slot inactive."""
    kd = np.asarray(jax.random.key_data(jax.random.key(0)))
    return {"tok": np.zeros(slots, np.int32), "lp": np.zeros(slots, np.float32), "pos": np.zeros(slots, np.int32),
            "gen": np.zeros(slots, np.int32), "max_new": np.zeros(slots, np.int32), "active": np.zeros(slots, bool),
            "key_data": np.zeros((slots,) + kd.shape, kd.dtype), "temperature": np.ones(slots, np.float32),
            "top_p": np.ones(slots, np.float32), "stops": np.full((slots, stop_slots), NO_STOP, np.int32)}


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

    `state` per slot (`init_slot_state`): ``tok`` (pending token, generated number ``gen``, to be fed
    at ``pos``), ``lp`` (its logprob), ``max_new``, ``active``, ``key_data`` (the sequence key),
    ``temperature``, ``top_p``, ``stops`` [S, n] (`NO_STOP` padded). Each step feeds every active
    slot's pending token (`sampler.decode_one`, recording it) and draws the next with
    ``fold_in(key, gen + 1)``; a slot finishes after feeding a stop id or its ``max_new``-th token.
    Leaves when nothing is active or, with `leave_after` > 0, once that many slots finished (to
    refill them). Returns (cache, state, outputs: ``tok``/``lp``/``fed`` [steps, S], ``ri``
    [steps, L_moe, S, k], ``steps`` run). With a `mesh` the window carried through the loop and the
    returned cache keep the slot layout."""
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

    sub = sharded.constrain_sampling_cache(cache_window(cache, window), mesh)
    i, sub, state, _, outs = jax.lax.while_loop(cond, body, (jnp.int32(0), sub, state, jnp.int32(0), outs))
    return sharded.constrain_sampling_cache(write_cache_window(cache, sub, window), mesh), state, dict(outs, steps=i)
