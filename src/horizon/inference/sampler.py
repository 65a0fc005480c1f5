"""Batched autoregressive sampling with the MLA latent KV cache (docs/SPEC.md §1, §4, §4.1).

`generate` decodes one fixed batch of prompts: the reference every sampler is tested against and
the fixed-batch path of benchmarks and tests. Agents and every RL / eval caller sample through the
rollout engine instead (`policy.rollout_policy`), which runs this module's decode step
(`decode_one`) and draws (`sample_from_logits`, `token_keys`), so a request samples what
`generate` samples for it alone with the same key. Layout, logprob and routing conventions,
buckets, the mesh and in-flight weight swaps: docs/INFERENCE.md ("Fixed-batch sampling").
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Sequence

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
    tokens only, not on its batch-mates, the batch size or the decode chunking."""
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
    hashes with) on uint32 arrays, as straight-line elementwise ops that XLA fuses into one kernel
    (XLA:CPU runs `jax.random`'s as a rolled loop of small kernels: docs/INFERENCE.md, "Draws").
    Bit-identical to JAX's (tests/rl/test_sampler.py)."""
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
    mass, e.g. outside the nucleus, is never drawn), where `jax.random.categorical` (Gumbel-max) draws
    one random number per vocabulary entry. Same distribution; different samples for a given key.
    `key` is one key (vmap it over rows); u is `uniform01`'s, i.e. ``jax.random.uniform(key)`` bit for
    bit. Two-level search: the running mass of the `layers.PREFIX_BLOCK`-token blocks picks the block,
    only that block's prefix sum picks the token (why: docs/INFERENCE.md, "Draws")."""
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
    """`argmax` over the last axis (the first maximal index) as a max and a min-index reduction, which
    XLA:CPU runs faster than its variadic argmax reduce (docs/INFERENCE.md, "Draws")."""
    V = logits.shape[-1]
    first = jnp.min(jnp.where(logits == jnp.max(logits, -1, keepdims=True), jnp.arange(V, dtype=jnp.int32), V), -1)
    return jnp.minimum(first, V - 1)          # an all-NaN row (no maximum) would give V


def sample_from_logits(
    logits: Float[Array, "b vocab"], keys: jax.Array, temperature: Float[Array, "*b"], top_p: Float[Array, "*b"]
) -> tuple[Int[Array, " b"], Float[Array, " b"]]:
    """Draw one token per row, row i with ``keys[i]``; return (token, untempered log-prob of it).

    `temperature` and `top_p` are scalars or one value per row (the engine's per-request sampling
    parameters, docs/SPEC.md §4); a row's draw depends only on its own logits, key and parameters.
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
    """The one decode step (docs/SPEC.md §1, §4) every decoder runs (`decode_step`, `decode_chunk`, the rollout
    engine's loop): feed `tok` at `pos` through `transformer.decode` (its latents written at slot
    `pos`; a position past the cache is not written), sample the next token per row with `keys`.
    Returns (cache, next token, its untempered logprob, the fed tokens' routing [L_moe, b, k])."""
    logits, cache, aux = transformer.decode(params, cache, tok[:, None], pos[:, None], cfg=cfg)
    nxt, lp = sample_from_logits(logits[:, 0], keys, temperature, top_p)
    return cache, nxt, lp, aux["router_indices"]


def sampler_numerics(cfg) -> dict:
    """The model fields a sampler runs with in place of the trainer's, from a full config's `rl.sampler`:
    `compute_dtype` ("" = the model's `dtype`) and `router_noise` (`model.router_logit_noise`, 0 = none).
    A sampler whose numerics differ from the trainer's, as an inference engine's do (docs/SPEC.md §4.1:
    what router replay and the stale-token corrections exist for); {} for a model config."""
    s = cfg.rl.sampler if "rl" in cfg and "sampler" in cfg.rl else None
    if s is None:
        return {}
    out = {}
    if str(s.get("compute_dtype", "") or ""):
        out["dtype"] = str(s.compute_dtype)
    if float(s.get("router_noise", 0.0)) > 0:
        out["router_logit_noise"] = float(s.router_noise)
    return out


def frozen_model_cfg(cfg) -> ml_collections.FrozenConfigDict:
    """The sampler's model config as a hashable FrozenConfigDict (the jitted steps' static argument):
    the model's, with `sampler_numerics` applied."""
    c = transformer.model_cfg(cfg)
    over = sampler_numerics(cfg)
    if over:
        # a copy: a FrozenConfigDict's `as_configdict()` is its own backing dict, which later freezes reread
        d = ml_collections.ConfigDict(c.to_dict()) if isinstance(c, ml_collections.FrozenConfigDict) \
            else c.copy_and_resolve_references()
        with d.unlocked():
            for k, v in over.items():
                d[k] = v
        c = d
    return c if isinstance(c, ml_collections.FrozenConfigDict) else ml_collections.FrozenConfigDict(c)


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """How `generate` samples (`sampler_config` reads it from a config's `rl.sampler` section).

    `temperature` / `top_p` shape the drawing distribution (logprobs stay the untempered model's);
    `stop_tokens` None = the model tokenizer's (end of turn, EOS); the `min_*_bucket`s are the
    compile-shape minimums of the batch, prompt and generation lengths; `sync_tokens` decode steps
    run per device chunk (one host sync each); with a `poll`, `chunk_tokens` steps run between weight
    polls and `kv_mode` ("keep" | "recompute") says what a switch does to the cache.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    stop_tokens: Sequence[int] | None = None
    min_batch_bucket: int = 1
    min_prompt_bucket: int = 16
    min_new_bucket: int = 16
    sync_tokens: int = 16
    chunk_tokens: int = 0
    kv_mode: str = "keep"


def sampler_config(cfg, **overrides) -> SamplerConfig:
    """`SamplerConfig` from a full config's `rl.sampler` section (configs/rl_tiny.py); `overrides`
    replace fields."""
    s = cfg.rl.sampler
    sc = dict(temperature=float(s.temperature), top_p=float(s.top_p), min_batch_bucket=int(s.min_batch_bucket),
              min_prompt_bucket=int(s.min_prompt_bucket), min_new_bucket=int(s.min_new_bucket),
              sync_tokens=int(s.sync_tokens), chunk_tokens=int(s.chunk_tokens), kv_mode=str(s.kv_mode))
    sc.update(overrides)
    return SamplerConfig(**sc)


def generate(
    params: dict | None,
    prompts: Sequence[Int[np.ndarray, " n"]],
    key: jax.Array,
    *,
    cfg,
    max_new_tokens: int,
    sampling: SamplerConfig = SamplerConfig(),
    version: int = 0,
    poll: Callable[[], tuple[dict, int]] | None = None,
) -> SampleOutput:
    """Sample continuations of `prompts` (1-D int token arrays) with the latent KV cache.

    `cfg` is the model config (or a full config with `.model`; its `mesh`, if any, shards the
    call); `sampling` says how (`SamplerConfig`). Deterministic in `key`; row i samples with its own
    keys (`sequence_keys`, `token_keys`), so its tokens do not depend on its batch-mates. Tokens are
    tagged with `version`; or, with `poll() -> (params, version)` (and `params=None`), weights come
    from `poll` and may switch every `sampling.chunk_tokens` steps. Prompts are padded with the
    tokenizer's pad id. Decode steps run on device in chunks (`decode_chunk`), one host sync each:
    a batch whose rows have all stopped may compute up to a chunk of steps that are thrown away, the
    price of not syncing every token. Conventions: docs/INFERENCE.md ("Fixed-batch sampling").
    """
    mesh = pmesh.run_mesh(cfg)
    tok_ = tokenizer_from_config(cfg)
    stops = tok_.stop_ids if sampling.stop_tokens is None else tuple(sampling.stop_tokens)
    min_batch = sampling.min_batch_bucket
    if mesh is not None:
        cfg = sharded.sampling_config(cfg)
        min_batch = max(int(min_batch), pmesh.axis_size(mesh, pmesh.BATCH_AXES))
    mcfg = frozen_model_cfg(cfg)
    _check_call(params, poll, sampling)
    if not prompts:
        return SampleOutput([], [], [], [], [], [], 0)
    prompts = _check_prompts(prompts, max_new_tokens, sampling.top_p, mcfg)
    run = _Decode(prompts, key, max_new_tokens, cfg=cfg, mcfg=mcfg, mesh=mesh, sampling=sampling,
                  min_batch=min_batch, pad_id=tok_.pad_id, stops=stops)
    run.start(*((params, version) if poll is None else poll()))
    K = int(sampling.chunk_tokens) if poll is not None else int(sampling.sync_tokens)
    for j in range(0, max_new_tokens, K):
        if poll is not None and j > 0:           # chunk boundaries are the poll points
            run.switch(*poll(), kv_mode=sampling.kv_mode)
        if run.decode(j, K):
            break
    return run.output()


def _check_call(params: dict | None, poll, sampling: SamplerConfig) -> None:
    """One-line errors for a weights source or sampling settings `generate` cannot run with."""
    if poll is not None:
        if params is not None:
            raise ValueError("pass either params or poll, not both")
        if sampling.chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1 with poll, got {sampling.chunk_tokens}")
    elif params is None:
        raise ValueError("generate needs params (or a poll function)")
    if sampling.sync_tokens < 1:
        raise ValueError(f"sync_tokens must be >= 1, got {sampling.sync_tokens}")
    if sampling.kv_mode not in KV_MODES:
        raise ValueError(f"kv_mode must be one of {KV_MODES}, got {sampling.kv_mode!r}")


def _check_prompts(prompts: Sequence[np.ndarray], max_new_tokens: int, top_p: float, mcfg) -> list[np.ndarray]:
    """`prompts` as 1-D int32 arrays, checked against the model (lengths, vocabulary)."""
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
    return prompts


class _Decode:
    """One `generate` call past its checks: the padded prompt block (row i: prompt i left-aligned,
    then pad ids; padding rows of length 1), the device state (weights, cache, pending token and the
    version that drew it) and the host buffers of what each row generated."""

    def __init__(self, prompts: list[np.ndarray], key: jax.Array, max_new: int, *, cfg, mcfg, mesh,
                 sampling: SamplerConfig, min_batch: int, pad_id: int, stops: Sequence[int]):
        self.cfg, self.mcfg, self.mesh = cfg, mcfg, mesh
        self.place = None if mesh is None else sharded.sampling_placer(mesh)
        self.n, self.max_new, self.pad_id = len(prompts), max_new, pad_id
        self.lens = np.array([len(p) for p in prompts], np.int32)
        B = bucket(self.n, min_batch)
        P = bucket(self.lens.max(), sampling.min_prompt_bucket)
        self.total = P + bucket(max_new, sampling.min_new_bucket)     # cache positions
        self.toks = np.full((B, P), pad_id, np.int32)
        for i, p in enumerate(prompts):
            self.toks[i, : len(p)] = p
        self.lens_b = np.ones((B,), np.int32)
        self.lens_b[: self.n] = self.lens
        self.seq_keys = sequence_keys(key, B)       # row i's samples: its own key (no dependence on batch-mates)
        self.temp, self.tp = jnp.float32(sampling.temperature), jnp.float32(sampling.top_p)
        self.stops = np.asarray(list(stops), np.int32)
        L_moe, k = transformer.layer_counts(mcfg)[1], int(mcfg.num_experts_per_tok)
        self.out_tok = np.zeros((B, max_new), np.int32)
        self.out_lp = np.zeros((B, max_new), np.float32)
        self.out_ver = np.full((B, max_new), -1, np.int32)
        self.out_ri = np.zeros((L_moe, B, max_new, k), np.int32)
        self.m = np.zeros((B,), np.int32)          # generated so far
        self.done = np.zeros((B,), bool)
        self.done[self.n:] = True                  # padding rows
        self.stopped = np.zeros((B,), bool)
        self.switches = 0

    def _placed(self, params: dict) -> dict:
        """Weights in the mesh's layout (the one rules table), else as they are."""
        return params if self.mesh is None else sharded.place_params(params, self.cfg, self.mesh)

    def start(self, params: dict, version: int) -> None:
        """Prefill the prompt block with `params`, drawing each row's first pending token."""
        self.params, self.version = self._placed(params), version
        cache = transformer.init_cache(self.mcfg, len(self.lens_b), self.total)
        toks_j, lens_j = jnp.asarray(self.toks), jnp.asarray(self.lens_b)
        if self.place is not None:
            cache, toks_j, lens_j = self.place(cache, toks_j, lens_j)
        self.lens_j = lens_j
        self.cache, self.tok, self.lp, self.prompt_ri = prefill(
            self.params, cache, toks_j, lens_j, token_keys(self.seq_keys, 0), self.temp, self.tp, cfg=self.mcfg)
        self.tok_version = version                 # the version that sampled the pending token `tok`

    def switch(self, params: dict, version: int, *, kv_mode: str) -> None:
        """A poll's answer: newer weights replace the current ones (and with "recompute" every row
        is prefilled again); the same version changes nothing."""
        if version == self.version:
            return
        self.params, self.version = self._placed(params), version
        self.switches += 1
        if kv_mode == "recompute":
            self._reprefill()
            self.tok_version = version

    def _reprefill(self) -> None:
        """kv_mode="recompute": prefill prompt + generated tokens with the new weights, draw the pending
        token (number m of each row) again with its own key, and overwrite the generated tokens'
        routing with the new prefill's."""
        (B, P), m, total = self.toks.shape, self.m, self.total
        L_moe, k = self.out_ri.shape[0], self.out_ri.shape[-1]
        full = np.full((B, total), self.pad_id, np.int32)
        full[:, :P] = self.toks
        for i in range(B):
            full[i, self.lens_b[i]: self.lens_b[i] + m[i]] = self.out_tok[i, : m[i]]
        cache = transformer.init_cache(self.mcfg, B, total)
        toks_j, lens_j = jnp.asarray(full), jnp.asarray(self.lens_b + m)
        if self.place is not None:
            cache, toks_j, lens_j = self.place(cache, toks_j, lens_j)
        self.cache, self.tok, self.lp, ri_full = prefill(
            self.params, cache, toks_j, lens_j, token_keys(self.seq_keys, jnp.asarray(m)), self.temp, self.tp,
            cfg=self.mcfg)
        ri_full = np.asarray(ri_full).reshape(L_moe, B, total, k)
        for i in range(self.n):
            self.out_ri[:, i, : m[i]] = ri_full[:, i, self.lens_b[i]: self.lens_b[i] + m[i]]

    def decode(self, j: int, K: int) -> bool:
        """Feed generated tokens j .. j+K-1 (recording them and their routing), drawing each next one;
        True once every row has stopped."""
        self.cache, self.tok, self.lp, fed, fed_lp, fed_ri = decode_chunk(
            self.params, self.cache, self.tok, self.lp, self.lens_j, jnp.int32(j), self.seq_keys, self.temp,
            self.tp, cfg=self.mcfg, steps=K)
        fed, fed_lp, fed_ri = np.asarray(fed), np.asarray(fed_lp), np.asarray(fed_ri)
        done = self.done
        for i in range(min(K, self.max_new - j)):
            live = ~done
            self.out_tok[live, j + i] = fed[i, live]
            self.out_lp[live, j + i] = fed_lp[i, live]
            self.out_ver[live, j + i] = self.tok_version if i == 0 else self.version
            self.out_ri[:, live, j + i] = fed_ri[i][:, live]
            self.m[live] += 1
            hit = live & np.isin(fed[i], self.stops)
            self.stopped |= hit
            done |= hit
            if done.all():
                break
        self.tok_version = self.version
        return bool(done.all())

    def output(self) -> SampleOutput:
        n, m, lens = self.n, self.m, self.lens
        L_moe, B, _, k = self.out_ri.shape
        prompt_ri = np.asarray(self.prompt_ri).reshape(L_moe, B, self.toks.shape[1], k)
        return SampleOutput(
            tokens=[self.out_tok[i, : m[i]].copy() for i in range(n)],
            logprobs=[self.out_lp[i, : m[i]].copy() for i in range(n)],
            router_indices=[self.out_ri[:, i, : m[i]].copy() for i in range(n)],
            prompt_router_indices=[prompt_ri[:, i, : lens[i]].copy() for i in range(n)],
            stopped=[bool(s) for s in self.stopped[:n]],
            versions=[self.out_ver[i, : m[i]].copy() for i in range(n)],
            switches=self.switches,
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




# ----------------------------------------------------------------------------- weights holder
class ParamsHolder:
    """Mutable holder for the sampler's weights + a version counter (docs/SPEC.md §4.1).

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
