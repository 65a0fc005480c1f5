"""DeepSeek-V3 mixture of experts with aux-loss-free balancing and router replay (docs/SPEC.md §1, §4.1).

Routing for a token with hidden ``x`` (router math in float32, as HF)::

    s = sigmoid(x @ router)                      # [E] affinity scores ("pre-bias")
    u = s + stop_gradient(router_bias)           # selection scores; the bias only picks experts
    group-limited (n_group > 1, topk_group < n_group): experts are split in n_group equal groups, a
        group's score is the sum of its top-2 values of u, only the topk_group best groups stay
        eligible (others get u = -inf)
    I = top_k(u, k)                              # chosen experts
    g_i = s_i / (sum_{j in I} s_j + 1e-20)       # if norm_topk_prob (else g_i = s_i)
    g_i *= routed_scaling_factor
    y = sum_{i in I} g_i * SwiGLU_i(x) + SwiGLU_shared(x)

Expert compute is a grouped GEMM: the ``T*k`` (token, expert) assignments are sorted by expert
(`expert_order`: a stable argsort, or a counting sort where that is faster), ``group_sizes =
bincount(expert)``, and each of the three expert GEMMs is one grouped GEMM (`horizon.quant.grouped`:
`ragged_dot` semantics, FLOPs proportional to the routed rows) through `expert_matmul` (the hook for
low-precision recipes, docs/SPEC.md §3). Outputs are
weighted by ``g`` and scatter-added back to their tokens.

Aux-loss-free balancing (DeepSeek-V3 §2.1.2): after a step, `update_router_bias` moves each layer's
bias by ``rate * sign(mean_load - load_e)`` (under-loaded experts become more attractive).

Router replay: ``replay_indices`` [T, k] (per MoE layer) replaces ``I``; the gate weights ``g`` are
still computed from the router's own scores ``s`` at the replayed experts, so the router gets
gradients. A token whose row holds any negative entry (use -1) is not replayed: it keeps the router's
own choice (tokens without recorded routing; also "no replay" inside one compiled function, which makes
replayed-vs-not comparisons bit-exact).
Plausibility filter (``replay_plausibility_ratio`` = rho > 0): a replayed expert ``e`` whose score
is below ``rho`` times the router's own k-th best eligible score (after group limiting) is replaced
by the best eligible expert not already in the (current) chosen set; slots are processed left to
right. ``replay_plausibility_score`` says which score: "gate" (default) the affinity ``s`` the gate
weights are made of, "selection" the bias-adjusted ``u`` (the bias only balances load, so an
expert the balancer favours would pass on its bias alone).

Router noise (``router_logit_noise`` = sigma > 0): the logits get ``sigma * (x / |x|) @ R`` with one
fixed Gaussian matrix ``R`` [embed, experts] (`router_noise`): per-token noise of standard
deviation sigma on each logit, deterministic in ``x``. Only a sampler sets it, to emulate an
inference engine whose routing differs from the trainer's (docs/SPEC.md §4.1, `rl.sampler.router_noise`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from horizon.model import layers
from horizon.quant import grouped
from horizon.quant.qmoe import quantized_ragged_dot

PRECISIONS_IMPLEMENTED = ("bf16", "default")
PRECISIONS_PLANNED = ("mxfp8", "nvfp4", "nvfp4_per_token_fwd_mxfp8_bwd")

# Alternative MoE-block implementations, selected by ``cfg.moe_impl`` (default "local" = `moe_block`
# below). `horizon.parallel.experts` registers "expert_parallel" (docs/SPEC.md §2).
MOE_IMPLS: dict = {}


def register_moe_impl(name: str, fn) -> None:
    """Register ``fn(p, x, *, cfg, replay_indices) -> (y, stats)`` as ``cfg.moe_impl = name``."""
    MOE_IMPLS[name] = fn


def moe_spec(cfg) -> dict:
    """Router, selection bias (float32, zero), routed experts [E, ...] and the shared expert(s)."""
    D, E, F = cfg.d_model, cfg.num_experts, cfg.moe_mlp_dim
    std, dt = cfg.init_std, layers.dtype_of(cfg.param_dtype)
    p = {
        "router": layers.normal((D, E), std, dt),
        "router_bias": layers.zeros((E,), jnp.float32),
        "experts": {
            "gate": layers.normal((E, D, F), std, dt),
            "up": layers.normal((E, D, F), std, dt),
            "down": layers.normal((E, F, D), std, dt),
        },
    }
    if cfg.num_shared_experts > 0:
        p["shared"] = layers.swiglu_spec(D, F * cfg.num_shared_experts, std=std, dtype=dt)
    return p


def moe_logical_axes(cfg) -> dict:
    axes = {
        "router": ("embed", "router_expert"),
        "router_bias": ("router_expert",),
        "experts": {
            "gate": ("expert", "embed", "moe_mlp"),
            "up": ("expert", "embed", "moe_mlp"),
            "down": ("expert", "moe_mlp", "embed"),
        },
    }
    if cfg.num_shared_experts > 0:
        axes["shared"] = {"gate": ("embed", "mlp"), "up": ("embed", "mlp"), "down": ("mlp", "embed")}
    return axes


def expert_matmul(
    x: Float[Array, "m k"], w: Float[Array, "experts k n"], group_sizes: Int[Array, " experts"], *, precision: str,
    division: str = "ieee", approx_bits: int = 22, impl: str = "auto",
) -> Float[Array, "m n"]:
    """Grouped GEMM over expert-sorted rows: rows ``[sum(gs[:e]), sum(gs[:e+1]))`` use ``w[e]``.

    ``precision`` selects the recipe (docs/SPEC.md §3): "bf16"/"default" is the grouped GEMM
    (`horizon.quant.grouped.grouped_matmul`, `ragged_dot` semantics at the routed rows' FLOPs) in the
    compute dtype; the block-scaled recipes ("mxfp8", "nvfp4", "nvfp4_per_token_fwd_mxfp8_bwd") go through
    `horizon.quant.qmoe.quantized_ragged_dot` (custom VJP: quantized forward, MXFP8 backward).
    ``division``/``approx_bits`` select IEEE vs approximate-reciprocal scale division (ablation);
    ``impl`` the bf16 grouped GEMM's implementation (`model.grouped_impl`, `grouped.choose_impl`).
    """
    if precision in PRECISIONS_IMPLEMENTED:
        return grouped.grouped_matmul(x, w.astype(x.dtype), group_sizes, impl=impl)
    if precision in PRECISIONS_PLANNED:
        return quantized_ragged_dot(x, w, group_sizes, precision=precision, division=division,
                                    approx_bits=approx_bits)
    raise ValueError(f"unknown moe_precision {precision!r}; expected {PRECISIONS_IMPLEMENTED + PRECISIONS_PLANNED}")


def _group_limit(u: jax.Array, cfg) -> jax.Array:
    """Set selection scores of experts outside the top `topk_group` groups to -inf (HF DeepseekV3)."""
    G, kg = cfg.n_group, cfg.topk_group
    if G <= 1 or kg >= G:
        return u
    T, E = u.shape
    grouped = u.reshape(T, G, E // G)
    group_scores = jax.lax.top_k(grouped, 2)[0].sum(-1)  # [T, G]
    _, keep = jax.lax.top_k(group_scores, kg)
    group_mask = jnp.zeros((T, G), bool).at[jnp.arange(T)[:, None], keep].set(True)
    expert_mask = jnp.repeat(group_mask, E // G, axis=1)
    return jnp.where(expert_mask, u, -jnp.inf)


def plausibility_filter(
    replay: Int[Array, "tokens k"], u: Float[Array, "tokens experts"], u_eligible: Float[Array, "tokens experts"],
    ratio: float
) -> Int[Array, "tokens k"]:
    """Replace replayed experts whose score ``u < ratio * (the k-th best eligible score)`` by the best
    eligible expert not yet chosen (``u``: the gate or the selection score, module docstring)."""
    k = replay.shape[1]
    E = u.shape[1]
    kth = jax.lax.top_k(u_eligible, k)[0][:, -1]
    thr = ratio * kth
    idx = replay
    for slot in range(k):
        cur = idx[:, slot]
        bad = jnp.take_along_axis(u, cur[:, None], axis=1)[:, 0] < thr
        chosen = jax.nn.one_hot(idx, E, dtype=bool).any(axis=1)
        cand = jnp.argmax(jnp.where(chosen, -jnp.inf, u_eligible), axis=1).astype(idx.dtype)
        idx = idx.at[:, slot].set(jnp.where(bad, cand, cur))
    return idx


ROUTER_NOISE_SEED = 20261207     # the fixed matrix of `router_noise`
PLAUSIBILITY_SCORES = ("gate", "selection")


def router_noise(x: Float[Array, "tokens embed"], num_experts: int, sigma: float) -> Float[Array, "tokens experts"]:
    """``sigma * (x / |x|) @ R``, ``R`` [embed, experts] a Gaussian draw fixed by `ROUTER_NOISE_SEED` with
    columns rescaled to norm sqrt(embed): each logit moves by noise of std sigma for directions of ``x``
    spread over the embedding (whatever the scale of ``x``), different per token, the same per ``x``."""
    xf = x.astype(jnp.float32)
    d = x.shape[-1]
    r = jax.random.normal(jax.random.key(ROUTER_NOISE_SEED), (d, num_experts), jnp.float32)
    r = r * jnp.sqrt(d / jnp.sum(r * r, axis=0, keepdims=True))     # columns of norm sqrt(d): exact scale
    unit = xf * jax.lax.rsqrt(jnp.sum(xf * xf, axis=-1, keepdims=True) + 1e-30)
    return sigma * (unit @ r)


def _filter_scores(s: jax.Array, u: jax.Array, u_eligible: jax.Array, cfg) -> tuple[jax.Array, jax.Array]:
    """(score, eligible score) the plausibility filter compares (module docstring)."""
    if str(cfg.get("replay_plausibility_score", "gate")) == "selection":
        return u, u_eligible
    return s, jnp.where(jnp.isneginf(u_eligible), -jnp.inf, s)


def route(
    p: dict, x: Float[Array, "tokens embed"], *, cfg, replay_indices: Int[Array, "tokens k"] | None = None
) -> tuple[Float[Array, "tokens k"], Int[Array, "tokens k"]]:
    """Gate weights (float32, differentiable w.r.t. the router) and chosen expert indices (int32)."""
    k = cfg.num_experts_per_tok
    logits = x.astype(jnp.float32) @ p["router"].astype(jnp.float32)
    sigma = float(cfg.get("router_logit_noise", 0.0))
    if sigma > 0:
        logits = logits + jax.lax.stop_gradient(router_noise(x, logits.shape[-1], sigma))
    s = jax.nn.sigmoid(logits)
    u = s + jax.lax.stop_gradient(p["router_bias"].astype(jnp.float32))
    u_eligible = _group_limit(u, cfg)
    own = jax.lax.top_k(u_eligible, k)[1].astype(jnp.int32)
    if replay_indices is None:
        idx = own
    else:
        if replay_indices.shape != (x.shape[0], k):
            raise ValueError(f"replay_indices shape {replay_indices.shape} != {(x.shape[0], k)}")
        rep = jax.lax.stop_gradient(replay_indices).astype(jnp.int32)
        replayed = jnp.all(rep >= 0, axis=1, keepdims=True)  # tokens with any -1 keep the router's choice
        idx = jnp.where(replayed, rep, own)
        if cfg.replay_plausibility_ratio > 0:
            score, eligible = _filter_scores(*jax.lax.stop_gradient((s, u, u_eligible)), cfg)
            filtered = plausibility_filter(idx, score, eligible, float(cfg.replay_plausibility_ratio))
            idx = jnp.where(replayed, filtered, own)
    w = jnp.take_along_axis(s, idx, axis=1)
    if cfg.norm_topk_prob:
        w = w / (w.sum(-1, keepdims=True) + 1e-20)
    return w * cfg.routed_scaling_factor, idx


def grouped_swiglu(
    p: dict, xs: Float[Array, "rows embed"], group_sizes: Int[Array, " experts"], *, cfg
) -> Float[Array, "rows embed"]:
    """Expert SwiGLU on rows sorted by expert (`group_sizes[e]` consecutive rows each; rows past their
    sum are zeros): the grouped GEMM at `cfg.moe_precision`, shared by the local block and the
    expert-parallel one (horizon.parallel.experts) so both quantize alike (docs/SPEC.md §1, §3)."""
    mm = functools.partial(expert_matmul, group_sizes=group_sizes, precision=cfg.moe_precision,
                           division=cfg.get("quant_division", "ieee"),
                           approx_bits=cfg.get("quant_approx_rcp_bits", 22), impl=cfg.get("grouped_impl", "auto"))
    h = jax.nn.silu(mm(xs, p["gate"])) * mm(xs, p["up"])
    return mm(h, p["down"])


# Per backend, where `expert_order` sorts by counting instead of `argsort`: (fewest assignments,
# most assignments x experts). XLA:CPU's stable sort of int32 keys is slow (~150 ns per key); the
# counting sort is a one-hot prefix sum (`layers.prefix_sum`), so its cost grows with n x E. The range
# is where counting won in the argsort-vs-counting timings (docs/PERF.md "Decode step, prefill and the
# old-path baseline"): argsort stays faster below 256 assignments and at large n x E.
# Not listed (GPU: a radix sort): always `argsort`.
COUNTING_SORT = {"cpu": (256, 1 << 19)}


def expert_order(flat: Int[Array, " n"], num_experts: int) -> Int[Array, " n"]:
    """``argsort(flat, stable=True)`` of expert ids in [0, num_experts): assignments grouped by expert,
    each group in its original order. Inside this backend's `COUNTING_SORT` range it is a counting
    sort: rank = the expert's first slot + the earlier assignments to it (one-hot prefix sums, exact
    in float32 below 2^24), scattered into the inverse permutation; the same result, bit for bit."""
    n = flat.shape[0]
    lo, hi = COUNTING_SORT.get(jax.default_backend(), (1, 0))
    if not (n >= lo and n * num_experts <= hi):
        return jnp.argsort(flat, stable=True)
    onehot = (flat[None, :] == jnp.arange(num_experts, dtype=flat.dtype)[:, None]).astype(jnp.float32)  # [E, n]
    sizes = onehot.sum(-1)
    before = layers.prefix_sum(onehot) - onehot + (jnp.cumsum(sizes) - sizes)[:, None]
    rank = jnp.sum(onehot * before, axis=0).astype(jnp.int32)
    return jnp.zeros(n, jnp.int32).at[rank].set(jnp.arange(n, dtype=jnp.int32), unique_indices=True)


def routed_experts(
    p: dict, x: Float[Array, "tokens embed"], weights: Float[Array, "tokens k"], idx: Int[Array, "tokens k"], *, cfg
) -> Float[Array, "tokens embed"]:
    """Sum of gate-weighted expert SwiGLUs via sorted tokens + the grouped GEMM (no dense expert loop)."""
    T, k = idx.shape
    E = cfg.num_experts
    flat = idx.reshape(-1)
    order = expert_order(flat, E)
    token_of = order // k
    group_sizes = jnp.bincount(flat, length=E).astype(jnp.int32)
    xs = jnp.take(x, token_of, axis=0)
    y = grouped_swiglu(p, xs, group_sizes, cfg=cfg)
    y = y * weights.reshape(-1)[order][:, None].astype(y.dtype)
    return jnp.zeros_like(x).at[token_of].add(y)


def moe_block(
    p: dict, x: Float[Array, "batch seq embed"], *, cfg, replay_indices: Int[Array, "tokens k"] | None = None
) -> tuple[Float[Array, "batch seq embed"], dict]:
    """Routed + shared experts. Returns (output, stats) with stats["indices"] int32 [T, k] and
    stats["load"] float32 [E] (tokens routed to each expert); T = batch * seq."""
    impl = cfg.get("moe_impl", "local")
    if impl != "local":
        if impl not in MOE_IMPLS:
            raise ValueError(f"moe_impl {impl!r} is not registered (known: {['local', *MOE_IMPLS]}); "
                             "import horizon.parallel to register the parallel implementations")
        return MOE_IMPLS[impl](p, x, cfg=cfg, replay_indices=replay_indices)
    b, s, D = x.shape
    xf = x.reshape(b * s, D)
    w, idx = route(p, xf, cfg=cfg, replay_indices=replay_indices)
    y = routed_experts(p["experts"], xf, w, idx, cfg=cfg)
    if "shared" in p:
        y = y + layers.swiglu(p["shared"], xf)
    load = jnp.bincount(idx.reshape(-1), length=cfg.num_experts).astype(jnp.float32)
    return y.reshape(b, s, D), {"indices": idx, "load": load}


def update_router_bias(params: dict, router_load: Float[Array, "moe_layers experts"], cfg) -> dict:
    """Aux-loss-free balancing: ``bias += rate * sign(mean(load) - load)`` per MoE layer.

    `params` is the full model tree; returns a new tree with ``params["moe"]["moe"]["router_bias"]``
    updated (no-op when the model has no MoE layers). `router_load` is ``aux["router_load"]`` (sum it
    over micro-batches first if accumulating).
    """
    cfg = cfg.model if "model" in cfg else cfg
    if "moe" not in params:
        return params
    bias = params["moe"]["moe"]["router_bias"]
    if router_load.shape != bias.shape:
        raise ValueError(f"router_load shape {router_load.shape} != router_bias shape {bias.shape}")
    load = router_load.astype(jnp.float32)
    delta = cfg.router_bias_update_rate * jnp.sign(load.mean(-1, keepdims=True) - load)
    new = dict(params)
    new["moe"] = dict(params["moe"])
    new["moe"]["moe"] = dict(params["moe"]["moe"])
    new["moe"]["moe"]["router_bias"] = (bias + delta).astype(bias.dtype)
    return new
