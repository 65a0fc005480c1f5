"""Batched autoregressive sampling with the MLA latent KV cache (SPEC §1, §4).

`generate` decodes one fixed batch of prompts. Agents and every RL / eval caller sample through the
rollout engine instead (`horizon.inference.policy.rollout_policy`), which runs this module's decode
step (`decode_one`) and sampling (`sample_from_logits`, `token_keys`), so a request samples what
`generate` samples for it alone with the same key; `generate` stays the reference and the fixed-batch
path of benchmarks and tests.

Layout. Prompts are **left-aligned**: row i holds its prompt at positions/cache slots
``0..n_i-1`` followed by padding, so every sequence sees exactly the positions it will have
in the training forward (`transformer.forward` numbers each row 0..s-1). The padded prompt
block is prefilled in one `transformer.decode` call; pad tokens write junk into slots
``>= n_i``, which is harmless: row i's j-th generated token is written to slot ``n_i + j``
before any query can see that slot (a query at position p sees slots ``<= p``).

Steps. After prefill, each step feeds every row its last sampled token at position
``n_i + j`` (one jitted `decode` of one token per row). Feeding the token both samples the
next one and yields the token's MoE routing, so ``router_indices[:, j]`` are the experts
that processed generated token j *as an input* — exactly what the training forward over
the same row replays (router replay, SPEC §1/§4.1). A row stops after it samples a stop
token (END_TURN / EOS by default; the stop token is kept and trained on) or reaches
``max_new_tokens``; its final token is still fed once so its routing is recorded.

Log-probs. ``logprobs[j] = log_softmax(logits)[token_j]`` of the **untempered** model at
temperature 1 and without the top-p truncation, i.e. the same quantity the trainer computes
(`horizon.rl.algo.trainer.token_logprobs`), so the importance ratio ``exp(logp_train -
logp_sampler)`` compares like with like and is 1 up to numerics when weights and routing
match. The tokens themselves are drawn from the tempered, nucleus-truncated distribution;
that distribution shift is not corrected (as in the report's setup and most RL stacks);
run with ``temperature=1, top_p=1`` for exactly on-policy samples.

Shapes are bucketed (powers of two, with config minimums) for batch, prompt length and
generation length so the prefill and step functions compile once per bucket.

Mesh (SPEC §2). With a full config whose ``mesh`` asks for several devices (`mesh.run_mesh`),
`generate` runs sharded: params are placed by the one rules table, the padded prompt block, lengths
and latent KV cache ``[L, b, slots, r]`` are split over the batch axes
(`horizon.parallel.sharded.sampling_placer`; the batch bucket is at least the data-parallel rank
count), and the jitted prefill / decode step are partitioned by GSPMD from those input shardings.
Decode runs the plain attention / MoE paths (`sharded.sampling_config`): one token per row has no
sequence to split over ``context``.

In-flight weight updates (SPEC §4.1, PipelineRL). With `poll() -> (params, version)` instead
of fixed params, `generate` checks for newer weights every `chunk_tokens` decode steps and
switches to them *mid-generation*. Every generated token is tagged with the version whose
weights produced the logits it was sampled from (`versions[i]`), and its recorded logprob is
that version's, so the trainer's importance ratio compares against the policy that actually
sampled each token. Two KV-cache policies at a switch (`kv_mode`):

* ``"keep"`` (default, PipelineRL): keep the KV cache computed by the old weights and continue
  with the new ones. Cheapest; the new tokens' logits see old-weight keys/values of the prefix.
  The token already sampled when the switch happens keeps the old version.
* ``"recompute"``: drop the pending token, re-prefill prompt + generated tokens with the new
  weights (one prefill of the whole row) and sample the next token from that: tokens after the
  switch are exactly the new policy's samples; one prefill per switch. Router indices of the
  re-prefilled generated tokens are replaced by the new prefill's routing.

Without a switch the two are the same computation, with the same keys, as fixed params.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jaxtyping import Array, Float, Int

from horizon.data.tokenizer import tokenizer_from_config
from horizon.model import layers, transformer
from horizon.parallel import mesh as pmesh
from horizon.parallel import sharded
from horizon.utils.shapes import bucket  # the one compile-shape bucket (trainer rows, sampler batches)

KV_MODES = ("keep", "recompute")


@dataclasses.dataclass
class SampleOutput:
    """Per-sequence results of `generate` (lists indexed like the input prompts).

    tokens[i]: int32 [m_i] generated tokens (stop token included if one was sampled).
    logprobs[i]: float32 [m_i] untempered model log-prob of each generated token.
    router_indices[i]: int32 [L_moe, m_i, k] experts that processed each generated token.
    prompt_router_indices[i]: int32 [L_moe, n_i, k] experts of the prompt tokens at prefill.
    stopped[i]: True if a stop token ended the sequence, False if max_new_tokens did.
    versions[i]: int32 [m_i] weights version that sampled each token (in-flight updates).
    switches: weight switches during the call (0 without `poll`).
    """

    tokens: list[np.ndarray]
    logprobs: list[np.ndarray]
    router_indices: list[np.ndarray]
    prompt_router_indices: list[np.ndarray]
    stopped: list[bool]
    versions: list[np.ndarray] = dataclasses.field(default_factory=list)
    switches: int = 0


def sequence_keys(key: jax.Array, rows: int) -> jax.Array:
    """One key per sequence (row) of a `generate` call: ``fold_in(key, row)``."""
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(rows, dtype=jnp.int32))


def token_keys(seq_keys: jax.Array, index) -> jax.Array:
    """The keys that draw each row's generated token number `index` (scalar or per row):
    ``fold_in(sequence key, index)``. A sequence's samples thus depend on its key and its own
    tokens only, not on its batch-mates, the batch size or the decode chunking (issue 24)."""
    idx = jnp.broadcast_to(jnp.asarray(index, jnp.int32), (seq_keys.shape[0],))
    if not _unrolled_threefry(seq_keys):
        return jax.vmap(jax.random.fold_in)(seq_keys, idx)
    kd = jax.random.key_data(seq_keys)
    zero = jnp.zeros_like(idx, jnp.uint32)
    y1, y2 = threefry2x32(kd[..., 0], kd[..., 1], zero, idx.astype(jnp.uint32))
    return jax.random.wrap_key_data(jnp.stack([y1, y2], axis=-1), impl=jax.random.key_impl(seq_keys))


def uniform01(key: jax.Array) -> Float[Array, "*b"]:
    """``jax.random.uniform(key, (), float32)`` for each key of a batch, bit for bit (`threefry2x32`)."""
    if not _unrolled_threefry(key):
        return jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(key.reshape(-1)).reshape(key.shape)
    kd = jax.random.key_data(key)
    zero = jnp.zeros(key.shape, jnp.uint32)
    b1, b2 = threefry2x32(kd[..., 0], kd[..., 1], zero, zero)     # the counter of a scalar draw is (0, 0)
    mant = jax.lax.shift_right_logical(b1 ^ b2, jnp.uint32(32 - 23)) | jnp.uint32(0x3F800000)
    return jnp.maximum(jax.lax.bitcast_convert_type(mant, jnp.float32) - 1.0, 0.0)


def _unrolled_threefry(keys: jax.Array) -> bool:
    """Whether `token_keys` / `uniform01` may use `threefry2x32`: threefry keys under JAX's default
    partitionable bit generation (what they reproduce); otherwise they call `jax.random`."""
    partitionable = getattr(jax.config, "jax_threefry_partitionable", True)   # the only mode where the flag is gone
    return str(jax.random.key_impl(keys)) == "threefry2x32" and bool(partitionable)


_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def threefry2x32(k1: Array, k2: Array, x1: Array, x2: Array) -> tuple[Array, Array]:
    """The Threefry-2x32 block cipher (20 rounds; Salmon et al. 2011, what `jax.random`'s default key
    hashes with) on uint32 arrays, as straight-line elementwise ops. XLA:CPU lowers `jax.random`'s
    threefry to a 5-iteration loop (kept rolled to save compile time): a loop of small kernels per
    `fold_in` or `uniform`, ~80 of a tiny model's ~640 us decode step (2 cores, 2026-12-05, docs/PERF.md
    "Decode step"); unrolled, XLA fuses the whole cipher into one kernel. Bit-identical to JAX's
    (tests/rl/test_sampler.py)."""
    u = jnp.uint32
    ks = (k1, k2, k1 ^ k2 ^ u(0x1BD11BDA))
    x1, x2 = x1 + ks[0], x2 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x1 = x1 + x2
            x2 = (jax.lax.shift_left(x2, u(r)) | jax.lax.shift_right_logical(x2, u(32 - r))) ^ x1
        x1, x2 = x1 + ks[(i + 1) % 3], x2 + ks[(i + 2) % 3] + u(i + 1)
    return x1, x2


def categorical(key: jax.Array, logits: Float[Array, " vocab"]) -> Int[Array, ""]:
    """One draw from softmax(`logits`) by inverse CDF: one uniform u, the first token whose cumulative
    mass reaches (1 - u) of the total (u in [0, 1), so the target is in (0, total] and a token of zero
    mass, e.g. outside the nucleus, is never drawn). `jax.random.categorical` (Gumbel-max) draws one
    random number per vocabulary entry instead: on 2 CPU cores, 32 rows, 153 vs 6 us per draw at a
    256-token vocabulary and 13.6 vs 0.35 ms at 32k (docs/PERF.md "Decode step"), most of a small
    model's decode step. Same distribution; different samples for a given key. `key` is one key (vmap
    it over rows); u is `uniform01`'s, i.e. ``jax.random.uniform(key)`` bit for bit.

    The search is two-level: the running mass of the `layers.PREFIX_BLOCK`-token blocks picks the block, and
    only that block's prefix sum picks the token (a full-vocabulary `layers.prefix_sum` was ~30 of a tiny
    model's ~600 us decode step; docs/PERF.md "Decode step", second session of 2026-12-05)."""
    u = uniform01(key)
    e = jnp.exp(logits - jnp.max(logits))
    V, B = e.shape[-1], layers.PREFIX_BLOCK
    nb = -(-V // B)
    blocks = jnp.pad(e, (0, nb * B - V)).reshape(nb, B)
    tot = jnp.sum(blocks, axis=-1)
    cum = layers.prefix_sum(tot)
    target = (1.0 - u) * cum[-1]
    j = jnp.minimum(jnp.sum(cum < target), nb - 1)
    row = blocks[j]
    within = layers.prefix_sum(row) + (cum[j] - tot[j])
    last = jnp.max(jnp.where(row > 0, jnp.arange(B), 0))     # rounding never lands past the block's mass
    return (j * B + jnp.minimum(jnp.sum(within < target), last)).astype(jnp.int32)


def greedy_tokens(logits: Float[Array, "b vocab"]) -> Int[Array, " b"]:
    """`argmax` over the last axis (the first maximal index) as a max and a min-index reduction:
    XLA:CPU's variadic argmax reduce took 26 us for 32 x 320, this 8 us."""
    V = logits.shape[-1]
    first = jnp.min(jnp.where(logits == jnp.max(logits, -1, keepdims=True), jnp.arange(V, dtype=jnp.int32), V), -1)
    return jnp.minimum(first, V - 1)          # an all-NaN row (no maximum) would give V


def sample_from_logits(
    logits: Float[Array, "b vocab"], keys: jax.Array, temperature: Float[Array, "*b"], top_p: Float[Array, "*b"]
) -> tuple[Int[Array, " b"], Float[Array, " b"]]:
    """Draw one token per row, row i with ``keys[i]``; return (token, untempered log-prob of it).

    `temperature` and `top_p` are scalars or one value per row (the engine's per-request sampling
    parameters, SPEC §4); a row's draw depends only on its own logits, key and parameters.
    temperature <= 0 is greedy (argmax). top_p < 1 keeps the smallest set of most likely tokens
    (under the tempered distribution) whose mass reaches top_p (always >= 1 token). Both are
    traced, so changing them does not recompile.
    """
    logits = logits.astype(jnp.float32)
    b = logits.shape[0]
    lse = jax.nn.logsumexp(logits, axis=-1)      # log_softmax at the drawn token only (no [b, V] logp)
    temperature = jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), (b,))
    top_p = jnp.broadcast_to(jnp.asarray(top_p, jnp.float32), (b,))

    def nucleus(scaled):            # a full-vocab sort: only run when some top_p < 1 (lax.cond runs one branch)
        srt = jnp.sort(scaled, axis=-1)[:, ::-1]
        probs = jax.nn.softmax(srt, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        n_keep = jnp.sum(mass_before < top_p[:, None], axis=-1)  # >= 1 since mass_before[:, 0] = 0
        thresh = jnp.take_along_axis(srt, (n_keep - 1)[:, None], axis=-1)
        return jnp.where((scaled >= thresh) | (top_p[:, None] >= 1.0), scaled, -jnp.inf)

    def sample(_):
        scaled = logits / jnp.maximum(temperature, 1e-6)[:, None]
        scaled = jax.lax.cond(jnp.any(top_p < 1.0), nucleus, lambda z: z, scaled)
        drawn = jax.vmap(categorical)(keys, scaled)
        return jax.lax.cond(jnp.any(temperature <= 0),      # greedy rows among sampled ones
                            lambda d: jnp.where(temperature <= 0, greedy_tokens(logits), d), lambda d: d, drawn)

    tok = jax.lax.cond(jnp.all(temperature <= 0), lambda _: greedy_tokens(logits), sample, None)
    return tok, jnp.take_along_axis(logits, tok[:, None], axis=-1)[:, 0] - lse


@functools.partial(jax.jit, static_argnames=("cfg",))
def prefill(params, cache, tokens, lengths, keys, temperature, top_p, *, cfg):
    """Prefill left-aligned padded prompts: (cache, next sampled token (row i with `keys[i]`), its
    logprob, prompt routing). `cfg` is the model config as a FrozenConfigDict (`frozen_model_cfg`)."""
    b, p = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
    logits, cache, aux = transformer.decode(params, cache, tokens, positions, cfg=cfg, logits_at=lengths - 1)
    tok, lp = sample_from_logits(logits[:, 0], keys, temperature, top_p)
    return cache, tok, lp, aux["router_indices"]


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("cache",))
def decode_step(params, cache, tok, pos, keys, temperature, top_p, *, cfg):
    """Feed `tok` at `pos` (recording its routing) and sample the next token (row i with `keys[i]`);
    donates `cache`."""
    return decode_one(params, cache, tok, pos, keys, temperature, top_p, cfg)


@functools.partial(jax.jit, static_argnames=("cfg", "steps"), donate_argnames=("cache",))
def decode_chunk(params, cache, tok, lp, lengths, start, seq_keys, temperature, top_p, *, cfg, steps):
    """`steps` consecutive `decode_step`s on device (one `lax.scan`: one dispatch and one host
    sync per chunk instead of per token). Step i feeds the pending token (generated token number
    ``start + i``) at position ``lengths + start + i`` and samples number ``start + i + 1`` with
    `token_keys(seq_keys, start + i + 1)`, so the samples do not depend on the chunking. Returns
    (cache, pending token, its logprob, fed tokens [steps, b], their logprobs [steps, b], their
    routing [steps, L_moe, b, k])."""

    def body(carry, i):
        cache, tok, lp = carry
        keys = token_keys(seq_keys, start + i + 1)
        cache, nxt, nlp, ri = decode_one(params, cache, tok, lengths + start + i, keys, temperature, top_p, cfg)
        return (cache, nxt, nlp), (tok, lp, ri)

    (cache, tok, lp), (toks, lps, ris) = jax.lax.scan(body, (cache, tok, lp), jnp.arange(steps, dtype=jnp.int32))
    return cache, tok, lp, toks, lps, ris


def decode_one(params: dict, cache: dict, tok: Int[Array, " b"], pos: Int[Array, " b"], keys: jax.Array,
               temperature: Float[Array, "*b"], top_p: Float[Array, "*b"], cfg):
    """The one decode step (SPEC §1, §4) every decoder runs (`decode_step`, `decode_chunk`, the rollout
    engine's loop): feed `tok` at `pos` through `transformer.decode` (its latents written at slot
    `pos`; a position past the cache is not written), sample the next token per row with `keys`.
    Returns (cache, next token, its untempered logprob, the fed tokens' routing [L_moe, b, k])."""
    logits, cache, aux = transformer.decode(params, cache, tok[:, None], pos[:, None], cfg=cfg)
    nxt, lp = sample_from_logits(logits[:, 0], keys, temperature, top_p)
    return cache, nxt, lp, aux["router_indices"]


def frozen_model_cfg(cfg) -> ml_collections.FrozenConfigDict:
    """The model config as a hashable FrozenConfigDict (the jitted steps' static argument)."""
    c = transformer.model_cfg(cfg)
    return c if isinstance(c, ml_collections.FrozenConfigDict) else ml_collections.FrozenConfigDict(c)


def generate(
    params: dict | None,
    prompts: Sequence[np.ndarray],
    key: jax.Array,
    *,
    cfg,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    stop_tokens: Sequence[int] | None = None,
    min_batch_bucket: int = 1,
    min_prompt_bucket: int = 16,
    min_new_bucket: int = 16,
    version: int = 0,
    poll: Callable[[], tuple[dict, int]] | None = None,
    chunk_tokens: int = 0,
    kv_mode: str = "keep",
    sync_tokens: int = 16,
) -> SampleOutput:
    """Sample continuations of `prompts` (1-D int token arrays) with the latent KV cache.

    `cfg` is the model config (or a full config with `.model`; its `mesh`, if any, shards the
    call: module docstring). See the module docstring for the layout, logprob and routing
    conventions. Deterministic in `key`; row i samples with its own keys (`sequence_keys`,
    `token_keys`), so its tokens do not depend on its batch-mates. Tokens are tagged with `version`; or, with
    `poll() -> (params, version)` (and `params=None`), weights come from `poll` and may switch
    every `chunk_tokens` steps (in-flight updates, module docstring; `kv_mode` "keep" |
    "recompute"). `stop_tokens` default to the model tokenizer's (`model.tokenizer`: end of turn,
    EOS); prompts are padded with its pad id. Decode steps run on device in chunks (`decode_chunk`) of `sync_tokens` steps
    (`chunk_tokens` with `poll`), one host sync each: a batch whose rows have all stopped may
    compute up to a chunk of steps that are thrown away, the price of not syncing every token.
    """
    mesh = pmesh.run_mesh(cfg)
    tok_ = tokenizer_from_config(cfg)
    stop_tokens = tok_.stop_ids if stop_tokens is None else tuple(stop_tokens)
    place = None
    if mesh is not None:
        cfg = sharded.sampling_config(cfg)
        place = sharded.sampling_placer(mesh)
        min_batch_bucket = max(int(min_batch_bucket), pmesh.axis_size(mesh, pmesh.BATCH_AXES))
    mcfg = frozen_model_cfg(cfg)
    if poll is not None:
        if params is not None:
            raise ValueError("pass either params or poll, not both")
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1 with poll, got {chunk_tokens}")
    elif params is None:
        raise ValueError("generate needs params (or a poll function)")
    if sync_tokens < 1:
        raise ValueError(f"sync_tokens must be >= 1, got {sync_tokens}")
    if kv_mode not in KV_MODES:
        raise ValueError(f"kv_mode must be one of {KV_MODES}, got {kv_mode!r}")
    if not prompts:
        return SampleOutput([], [], [], [], [], [], 0)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    prompts = [np.asarray(p, np.int32).reshape(-1) for p in prompts]
    lens = np.array([len(p) for p in prompts], np.int32)
    if lens.min() < 1:
        raise ValueError("every prompt needs at least one token")
    if lens.max() + max_new_tokens > mcfg.max_seq_len:
        raise ValueError(f"prompt ({lens.max()}) + max_new_tokens ({max_new_tokens}) exceeds "
                         f"max_seq_len={mcfg.max_seq_len}")
    if any(((p < 0) | (p >= mcfg.vocab_size)).any() for p in prompts):
        raise ValueError(f"prompt token ids must be in [0, {mcfg.vocab_size})")

    n = len(prompts)
    B = bucket(n, min_batch_bucket)
    P = bucket(lens.max(), min_prompt_bucket)
    N = bucket(max_new_tokens, min_new_bucket)
    toks = np.full((B, P), tok_.pad_id, np.int32)
    for i, p in enumerate(prompts):
        toks[i, : len(p)] = p
    lens_b = np.ones((B,), np.int32)
    lens_b[:n] = lens

    if poll is not None:
        params, version = poll()
    if mesh is not None:
        params = sharded.place_params(params, cfg, mesh)
    cache = transformer.init_cache(mcfg, B, P + N)
    toks_j, lens_j = jnp.asarray(toks), jnp.asarray(lens_b)
    if place is not None:
        cache, toks_j, lens_j = place(cache, toks_j, lens_j)
    seq_keys = sequence_keys(key, B)       # row i's samples: its own key (no dependence on batch-mates)
    temp, tp = jnp.float32(temperature), jnp.float32(top_p)
    cache, tok, lp, prompt_ri = prefill(params, cache, toks_j, lens_j, token_keys(seq_keys, 0), temp, tp, cfg=mcfg)
    tok_version = version                 # the version that sampled the pending token `tok`
    stops = np.asarray(list(stop_tokens), np.int32)
    L_moe = prompt_ri.shape[0]
    k = prompt_ri.shape[-1]
    out_tok = np.zeros((B, max_new_tokens), np.int32)
    out_lp = np.zeros((B, max_new_tokens), np.float32)
    out_ver = np.full((B, max_new_tokens), -1, np.int32)
    out_ri = np.zeros((L_moe, B, max_new_tokens, k), np.int32)
    m = np.zeros((B,), np.int32)          # generated so far
    done = np.zeros((B,), bool)
    done[n:] = True                       # padding rows
    stopped = np.zeros((B,), bool)
    switches = 0
    K = int(chunk_tokens) if poll is not None else int(sync_tokens)
    for j in range(0, max_new_tokens, K):
        if poll is not None and j > 0:           # chunk boundaries are the poll points
            new_params, new_version = poll()
            if new_version != version:
                params, version = new_params, new_version
                if mesh is not None:
                    params = sharded.place_params(params, cfg, mesh)
                switches += 1
                if kv_mode == "recompute":
                    cache, tok, lp = _reprefill(params, toks, lens_b, m, out_tok, out_ri, n, P + N, seq_keys,
                                                temp, tp, mcfg, place, tok_.pad_id)
                    tok_version = version
        # feed tokens j .. j+K-1 (records their routing), sampling each next one
        cache, tok, lp, fed, fed_lp, fed_ri = decode_chunk(params, cache, tok, lp, lens_j, jnp.int32(j), seq_keys,
                                                           temp, tp, cfg=mcfg, steps=K)
        fed, fed_lp, fed_ri = np.asarray(fed), np.asarray(fed_lp), np.asarray(fed_ri)
        for i in range(min(K, max_new_tokens - j)):
            live = ~done
            out_tok[live, j + i] = fed[i, live]
            out_lp[live, j + i] = fed_lp[i, live]
            out_ver[live, j + i] = tok_version if i == 0 else version
            out_ri[:, live, j + i] = fed_ri[i][:, live]
            m[live] += 1
            hit = live & np.isin(fed[i], stops)
            stopped |= hit
            done |= hit
            if done.all():
                break
        tok_version = version
        if done.all():
            break
    prompt_ri = np.asarray(prompt_ri).reshape(L_moe, B, P, k)
    return SampleOutput(
        tokens=[out_tok[i, : m[i]].copy() for i in range(n)],
        logprobs=[out_lp[i, : m[i]].copy() for i in range(n)],
        router_indices=[out_ri[:, i, : m[i]].copy() for i in range(n)],
        prompt_router_indices=[prompt_ri[:, i, : lens[i]].copy() for i in range(n)],
        stopped=[bool(s) for s in stopped[:n]],
        versions=[out_ver[i, : m[i]].copy() for i in range(n)],
        switches=switches,
    )


def lower_decode_step(params, cfg, batch: int, max_len: int):
    """The compiled decode step on inputs placed as `generate` places them under `cfg`'s mesh, for
    inspection: its ``output_shardings`` and ``as_text()`` HLO show how GSPMD partitioned it."""
    mesh = pmesh.run_mesh(cfg)
    if mesh is None:
        raise ValueError("lower_decode_step inspects a sharded decode: cfg.mesh must ask for several devices")
    c = sharded.sampling_config(cfg)
    mcfg = frozen_model_cfg(c)
    cache = transformer.init_cache(mcfg, batch, max_len)
    tok = jnp.zeros((batch,), jnp.int32)
    cache, tok, pos = sharded.sampling_placer(mesh)(cache, tok, tok)
    return decode_step.lower(sharded.place_params(params, c, mesh), cache, tok, pos,
                             sequence_keys(jax.random.key(0), batch), jnp.float32(0.0), jnp.float32(1.0),
                             cfg=mcfg).compile()


def _reprefill(params, toks, lens_b, m, out_tok, out_ri, n, total, seq_keys, temp, tp, mcfg, place, pad_id):
    """kv_mode="recompute" at a weight switch: prefill prompt + generated tokens with the new
    weights, sample the pending token (number m of each row) again with its own key, and overwrite
    the generated tokens' routing with the new prefill's (in place in `out_ri`). Returns (cache,
    tok, lp)."""
    B, P = toks.shape
    L_moe, k = out_ri.shape[0], out_ri.shape[-1]
    full = np.full((B, total), pad_id, np.int32)
    full[:, :P] = toks
    for i in range(B):
        full[i, lens_b[i]: lens_b[i] + m[i]] = out_tok[i, : m[i]]
    cache = transformer.init_cache(mcfg, B, total)
    toks_j, lens_j = jnp.asarray(full), jnp.asarray(lens_b + m)
    if place is not None:
        cache, toks_j, lens_j = place(cache, toks_j, lens_j)
    cache, tok, lp, ri_full = prefill(params, cache, toks_j, lens_j, token_keys(seq_keys, jnp.asarray(m)), temp, tp,
                                      cfg=mcfg)
    ri_full = np.asarray(ri_full).reshape(L_moe, B, total, k)
    for i in range(n):
        out_ri[:, i, : m[i]] = ri_full[:, i, lens_b[i]: lens_b[i] + m[i]]
    return cache, tok, lp


def sampler_kwargs_from_config(cfg) -> dict:
    """`generate` keyword args from the `c.rl.sampler` section (configs/rl_tiny.py)."""
    s = cfg.rl.sampler
    return dict(temperature=float(s.temperature), top_p=float(s.top_p),
                min_batch_bucket=int(s.min_batch_bucket), min_prompt_bucket=int(s.min_prompt_bucket),
                min_new_bucket=int(s.min_new_bucket), sync_tokens=int(s.sync_tokens))


# ----------------------------------------------------------------------------- weights holder
class ParamsHolder:
    """Mutable holder for the sampler's weights + a version counter (SPEC §4.1).

    The trainer (or weight-sync receiver) calls `update(new_params)`; the rollout engine's policy
    (`policy.EnginePolicy`, `policy.rollout_policy`) polls `get` at every engine round-trip, so a
    swap takes effect at its next one (tokens tagged with the version that sampled them).
    """

    def __init__(self, params: dict, version: int = 0):
        self._lock = threading.Lock()
        self._params = params
        self._version = int(version)

    def update(self, params: dict, version: int | None = None) -> int:
        with self._lock:
            self._params = params
            self._version = self._version + 1 if version is None else int(version)
            return self._version

    def get(self) -> tuple[dict, int]:
        with self._lock:
            return self._params, self._version

    @property
    def version(self) -> int:
        return self.get()[1]
