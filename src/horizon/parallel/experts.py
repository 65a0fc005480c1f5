"""Expert parallelism: all-to-all dispatch to expert owners, grouped GEMM, combine (docs/SPEC.md §2).

Selected by ``cfg.model.moe_impl = "expert_parallel"``. The whole MoE block runs inside one
`jax.shard_map` over all mesh axes; each device holds its tokens (batch over (data, fsdp, expert),
sequence over context) and the routed experts ``[E/EP, ...]`` of its ``expert`` rank (gathered over
the FSDP axes by XLA before the shard_map). Per device:

1. route its tokens locally (`moe.route`, same math, router replay included);
2. dispatch: each (token, expert) assignment goes to rank ``expert // (E/EP)`` of the ``expert``
   axis. Static shapes: a send buffer ``[EP, C, D]`` (C slots per destination) and one tiled
   `jax.lax.all_to_all`; optionally the payload is MXFP8 (`horizon.quant.formats.quantize_mxfp8`,
   E4M3 values + E8M0 scales per 32 elements) and dequantized on arrival; its backward sends the
   cotangent in the compute dtype (custom VJP);
3. local grouped GEMM over the received rows sorted by local expert (`moe.expert_matmul`, i.e.
   `jax.lax.ragged_dot`); empty slots sort last and fall outside every group (ragged_dot gives 0);
4. combine: the reverse all-to-all returns each expert output to its token's rank, where it is
   weighted by the gate and summed in float32 (then cast to the compute dtype, i.e. bf16 in bf16
   runs);
5. the shared expert runs locally.

Capacity. Drop-less is the default: ``mesh.capacity_factor = 0`` sizes ``C = T_local * k`` (the
worst case: every assignment of this device to one rank), which is exact for any routing but
``EP×`` larger than the balanced load. ``capacity_factor = f > 0`` uses
``C = ceil(f * T_local * k / EP)``; assignments beyond a destination's C are DROPPED (their expert
output is 0, the token keeps its shared-expert and residual path) and COUNTED: the block's stats get
``dropped`` (number of dropped assignments summed over devices); `sharded` reports it as a metric.

Dispatch kinds (``mesh.ep_dispatch``): "padded" (above; runs everywhere, the CPU test path) and
"ragged" — `jax.lax.ragged_all_to_all`, which sends only the real rows (DeepEP-like), but is not
implemented on XLA:CPU ("HLO opcode ragged-all-to-all is not supported"), so it is refused on CPU
with a clear error and is the path to use on GPU.

Micro-batch pipelining (``mesh.ep_microbatches = m``): the local tokens are split into ``m`` chunks
that are dispatched, computed and combined independently; chunk i+1's all-to-all has no data
dependence on chunk i's GEMM, so an async-collective backend (GPU) can overlap them. On CPU the
collectives are synchronous, so it only checks correctness there.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float, Int

from horizon.model import layers, moe
from horizon.parallel import mesh as pmesh
from horizon.quant import formats

IMPL_NAME = "expert_parallel"
DISPATCH_KINDS = ("padded", "ragged")
PAYLOADS = ("compute", "mxfp8")


def ep_options(cfg) -> dict:
    """EP knobs from the model config (copied there from ``cfg.mesh`` by `sharded.configure`)."""
    o = dict(capacity_factor=float(cfg.get("ep_capacity_factor", 0.0)),
             dispatch=str(cfg.get("ep_dispatch", "padded")),
             payload=str(cfg.get("ep_payload", "compute")),
             microbatches=int(cfg.get("ep_microbatches", 1)))
    if o["dispatch"] not in DISPATCH_KINDS:
        raise ValueError(f"ep_dispatch={o['dispatch']!r}; expected one of {DISPATCH_KINDS}")
    if o["payload"] not in PAYLOADS:
        raise ValueError(f"ep_payload={o['payload']!r}; expected one of {PAYLOADS}")
    if o["capacity_factor"] < 0 or o["microbatches"] < 1:
        raise ValueError("ep_capacity_factor must be >= 0 and ep_microbatches >= 1")
    return o


def capacity(tokens_local: int, k: int, ep: int, capacity_factor: float) -> int:
    """Slots per destination rank: worst case ``T*k`` when capacity_factor == 0 (drop-less)."""
    worst = tokens_local * k
    if capacity_factor <= 0:
        return worst
    return max(1, min(worst, math.ceil(capacity_factor * worst / ep)))


def _a2a(x: Array) -> Array:
    """[EP, C, ...] -> [EP, C, ...]: block j goes to expert rank j; row i of the result came from rank i."""
    return jax.lax.all_to_all(x, pmesh.EXPERT, 0, 0, tiled=True)


@jax.custom_vjp
def _a2a_mxfp8(x: Array) -> Array:
    """all-to-all of an MXFP8-quantized payload (dequantized to x's dtype on arrival)."""
    q = formats.quantize_mxfp8(x)
    vals = jax.lax.bitcast_convert_type(q.values, jnp.uint8)   # transport raw bytes
    scales = jax.lax.bitcast_convert_type(q.scales, jnp.uint8)
    vals, scales = _a2a(vals), _a2a(scales)
    q = formats.MXTensor(jax.lax.bitcast_convert_type(vals, jnp.float8_e4m3fn),
                         jax.lax.bitcast_convert_type(scales, jnp.float8_e8m0fnu))
    return formats.dequantize_mxfp8(q, x.dtype)


def _a2a_mxfp8_fwd(x):
    return _a2a_mxfp8(x), None


def _a2a_mxfp8_bwd(_, g):
    return (_a2a(g),)  # straight-through: the transpose of an all-to-all is the reverse all-to-all


_a2a_mxfp8.defvjp(_a2a_mxfp8_fwd, _a2a_mxfp8_bwd)


def _dispatch_compute_combine(p_exp, x, w, idx, *, ep: int, cap: int, opts: dict, cfg):
    """One chunk: x [T, D], w/idx [T, k] -> (y [T, D] in float32, number of dropped assignments)."""
    T, D = x.shape
    k = idx.shape[1]
    E_local = p_exp["gate"].shape[0]
    flat_e = idx.reshape(-1)
    tok = jnp.arange(T * k) // k
    dest = flat_e // E_local
    local_e = flat_e % E_local
    onehot = jax.nn.one_hot(dest, ep, dtype=jnp.int32)
    slot = jnp.sum(jnp.cumsum(onehot, axis=0) * onehot, axis=1) - 1     # rank among same-dest assignments
    keep = slot < cap
    slot_w = jnp.where(keep, slot, cap)                                  # out of bounds -> dropped by .set
    send_x = jnp.zeros((ep, cap, D), x.dtype).at[dest, slot_w].set(jnp.take(x, tok, axis=0), mode="drop")
    send_e = jnp.full((ep, cap), E_local, jnp.int32).at[dest, slot_w].set(local_e, mode="drop")
    recv_x = _a2a_mxfp8(send_x) if opts["payload"] == "mxfp8" else _a2a(send_x)
    recv_e = _a2a(send_e).reshape(-1)                                    # E_local marks an empty slot
    rows = recv_x.reshape(ep * cap, D)
    order = moe.expert_order(recv_e, E_local + 1)                        # stable; empty slots last
    group_sizes = jnp.bincount(recv_e, length=E_local).astype(jnp.int32)  # empty slots not counted
    xs = jnp.take(rows, order, axis=0)
    ys = moe.grouped_swiglu(p_exp, xs, group_sizes, cfg=cfg)
    y_rows = jnp.zeros_like(ys).at[order].set(ys)
    back = _a2a(y_rows.reshape(ep, cap, D))                             # combine in the compute dtype
    y_assign = back.at[dest, slot_w].get(mode="fill", fill_value=0).astype(jnp.float32)
    y_assign = y_assign * (w.reshape(-1) * keep).astype(jnp.float32)[:, None]
    y = jnp.zeros((T, D), jnp.float32).at[tok].add(y_assign)
    return y, jnp.sum(~keep)


def _local_moe(p, x, replay, *, cfg, ep: int, opts: dict):
    """Body on one device: x [b, s, D] local tokens -> (y, indices [b, s, k], load [E], dropped)."""
    b, s, D = x.shape
    T = b * s
    xf = x.reshape(T, D)
    rep = None if replay is None else replay.reshape(T, -1)
    w, idx = moe.route(p, xf, cfg=cfg, replay_indices=rep)
    m = opts["microbatches"]
    if T % m:
        raise ValueError(f"local tokens {T} not divisible by ep_microbatches={m}")
    Tc = T // m
    cap = capacity(Tc, idx.shape[1], ep, opts["capacity_factor"])
    ys, drops = [], []
    for i in range(m):  # independent chunks: chunk i+1's dispatch can overlap chunk i's GEMM
        sl = slice(i * Tc, (i + 1) * Tc)
        yi, di = _dispatch_compute_combine(p["experts"], xf[sl], w[sl], idx[sl], ep=ep, cap=cap, opts=opts, cfg=cfg)
        ys.append(yi)
        drops.append(di)
    y = jnp.concatenate(ys, axis=0).astype(x.dtype)
    if "shared" in p:
        y = y + layers.swiglu(p["shared"], xf)
    load = jnp.bincount(idx.reshape(-1), length=cfg.num_experts).astype(jnp.float32)
    load = jax.lax.psum(load, pmesh.TOKEN_AXES)
    dropped = jax.lax.psum(sum(drops).astype(jnp.float32), pmesh.TOKEN_AXES)
    return y.reshape(b, s, D), idx.reshape(b, s, -1), load, dropped


def ep_moe_block(
    p: dict, x: Float[Array, "batch seq embed"], *, cfg, replay_indices: Int[Array, "tokens k"] | None = None
) -> tuple[Float[Array, "batch seq embed"], dict]:
    """Drop-in for `moe.moe_block` under a mesh (`jax.set_mesh`) with an ``expert`` axis.

    Stats: ``indices`` int32 [T, k], ``load`` float32 [E] (global), ``dropped`` float32 [] (global
    count of dropped assignments; 0 when drop-less)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or pmesh.EXPERT not in mesh.axis_names:
        raise ValueError("ep_moe_block needs a mesh with an 'expert' axis set via jax.set_mesh")
    opts = ep_options(cfg)
    if opts["dispatch"] == "ragged":
        if jax.default_backend() == "cpu":
            raise NotImplementedError("ep_dispatch='ragged' uses jax.lax.ragged_all_to_all, which XLA:CPU does "
                                      "not implement; use 'padded' on CPU")
        raise NotImplementedError("ep_dispatch='ragged' (GPU) is not implemented yet; use 'padded'")
    ep = mesh.shape[pmesh.EXPERT]
    E = cfg.num_experts
    if E % ep:
        raise ValueError(f"num_experts={E} must be divisible by the expert axis size {ep}")
    b, s, D = x.shape
    act = P(pmesh.BATCH_AXES, pmesh.SEQ_AXIS, None)
    pspec = jax.tree.map(lambda _: P(), p)
    pspec["experts"] = jax.tree.map(lambda _: P(pmesh.EXPERT), p["experts"])
    rep = None if replay_indices is None else replay_indices.reshape(b, s, -1)
    rep_spec = None if rep is None else act
    body = functools.partial(_local_moe, cfg=cfg, ep=ep, opts=opts)
    f = jax.shard_map(body, mesh=mesh, in_specs=(pspec, act, rep_spec), out_specs=(act, act, P(), P()))
    y, idx, load, dropped = f(p, x, rep)
    return y, {"indices": idx.reshape(b * s, -1), "load": load, "dropped": dropped}


moe.register_moe_impl(IMPL_NAME, ep_moe_block)
