"""Basic layers as pure functions over param pytrees: RMSNorm, SwiGLU, embeddings, init (docs/SPEC.md §1).

* RMSNorm: ``y = w * (x / sqrt(mean(x^2) + eps))`` with statistics in float32, the normalised value cast
  back to the input dtype before the weight multiply (as HF DeepseekV3RMSNorm).
* SwiGLU: ``down(silu(x @ gate) * (x @ up))``; weights stored ``[in, out]``.
* Init: every matrix ~ N(0, init_std^2); norm weights 1; router bias 0. Init functions build a tree of
  `ParamSpec` leaves (shape, dtype, rule); `materialize` turns it into arrays with ONE normal draw for
  all matrices (sliced per array). One draw instead of one per array matters: each `jax.random.normal`
  instance costs ~0.5 s of XLA:CPU compile, ~20 s for a model's worth of arrays.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def dtype_of(name: str):
    """Map a config dtype string to a jnp dtype (clear error otherwise)."""
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPES)}")
    return DTYPES[name]


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """A parameter to be created: ``rule`` in {"normal", "ones", "zeros"}; ``std`` for "normal"."""

    shape: tuple[int, ...]
    dtype: object
    rule: str = "normal"
    std: float = 0.0


def normal(shape, std, dtype) -> ParamSpec:
    return ParamSpec(tuple(shape), dtype, "normal", float(std))


def ones(shape, dtype) -> ParamSpec:
    return ParamSpec(tuple(shape), dtype, "ones")


def zeros(shape, dtype) -> ParamSpec:
    return ParamSpec(tuple(shape), dtype, "zeros")


def _is_spec(x) -> bool:
    return isinstance(x, ParamSpec)


def stack_specs(tree, n: int):
    """Prepend a stacked-layer axis of size n to every spec in `tree`."""
    return jax.tree.map(lambda s: dataclasses.replace(s, shape=(n,) + s.shape), tree, is_leaf=_is_spec)


def materialize(key: jax.Array, tree):
    """Arrays for a `ParamSpec` tree: N(0, std^2) (sampled in float32, then cast) from one flat draw."""
    leaves, treedef = jax.tree.flatten(tree, is_leaf=_is_spec)
    n_normal = sum(math.prod(s.shape) for s in leaves if s.rule == "normal")
    flat = jax.random.normal(key, (n_normal,), jnp.float32) if n_normal else None
    out, off = [], 0
    for s in leaves:
        if s.rule == "normal":
            size = math.prod(s.shape)
            out.append((s.std * flat[off: off + size].reshape(s.shape)).astype(s.dtype))
            off += size
        elif s.rule == "ones":
            out.append(jnp.ones(s.shape, s.dtype))
        elif s.rule == "zeros":
            out.append(jnp.zeros(s.shape, s.dtype))
        else:
            raise ValueError(f"unknown init rule {s.rule!r}")
    return jax.tree.unflatten(treedef, out)


def rms_norm(weight: Float[Array, " dim"], x: Float[Array, "*batch dim"], eps: float) -> Float[Array, "*batch dim"]:
    """RMSNorm with float32 statistics; output in x's dtype."""
    xf = x.astype(jnp.float32)
    var = jnp.mean(xf * xf, axis=-1, keepdims=True)
    y = (xf * jax.lax.rsqrt(var + eps)).astype(x.dtype)
    return weight.astype(x.dtype) * y


def swiglu_spec(d_in: int, d_hidden: int, *, std: float, dtype) -> dict:
    return {
        "gate": normal((d_in, d_hidden), std, dtype),
        "up": normal((d_in, d_hidden), std, dtype),
        "down": normal((d_hidden, d_in), std, dtype),
    }


def swiglu(p: dict, x: Float[Array, "*batch embed"]) -> Float[Array, "*batch embed"]:
    """SwiGLU MLP in x's dtype."""
    dt = x.dtype
    h = jax.nn.silu(x @ p["gate"].astype(dt)) * (x @ p["up"].astype(dt))
    return h @ p["down"].astype(dt)


def embed(table: Float[Array, "vocab embed"], tokens: Int[Array, "*batch"], dtype) -> Float[Array, "*batch embed"]:
    """Token embedding lookup, cast to the compute dtype."""
    return jnp.take(table, tokens, axis=0).astype(dtype)


def unembed(
    h: Float[Array, "*batch embed"], lm_head: Float[Array, "embed vocab"]
) -> Float[Array, "*batch vocab"]:
    """Logits in float32 (``h @ lm_head`` with a float32 result)."""
    return _unembed(h, lm_head.astype(h.dtype))


@jax.custom_vjp
def _unembed(h, w):
    return jnp.einsum("...d,dv->...v", h, w, preferred_element_type=jnp.float32)


def _unembed_fwd(h, w):
    return _unembed(h, w), (h, w)


def _unembed_bwd(res, g):
    """The LM head's gradients (the largest GEMMs of a small-model step). ``dW = h^T g``
    contracts over tokens; XLA:CPU runs that dot with a transposed left operand ~1.5x slower than
    on a materialized ``h^T`` ([tokens, D]: a small copy), measured in benchmarks/train_step.py, so
    the transpose is pinned with an optimization barrier. Same products as autodiff's."""
    h, w = res
    d = h.shape[-1]
    h2, g2 = h.reshape(-1, d), g.reshape(-1, g.shape[-1])
    ht = jax.lax.optimization_barrier(h2.T)
    dw = jnp.dot(ht.astype(g2.dtype), g2, preferred_element_type=jnp.float32).astype(w.dtype)
    dh = jnp.einsum("...v,dv->...d", g, w, preferred_element_type=jnp.float32).astype(h.dtype)
    return dh, dw


_unembed.defvjp(_unembed_fwd, _unembed_bwd)


PREFIX_BLOCK = 64   # `prefix_sum`'s block: a [64, 64] triangular matmul per block (measured below)


def prefix_sum(x: Float[Array, "*b n"]) -> Float[Array, "*b n"]:
    """Inclusive cumulative sum over the last axis in two levels (the sampler's inverse CDF, the MoE's
    counting sort): within blocks of `PREFIX_BLOCK` by a triangular matmul, then the blocks' running
    totals. On CPU it is faster than XLA:CPU's `cumsum` (a reduce-window), at the same relative error
    (float32 sums; docs/PERF.md "Figures moved out of code comments")."""
    n = x.shape[-1]
    nb = -(-n // PREFIX_BLOCK)
    pad = [(0, 0)] * (x.ndim - 1) + [(0, nb * PREFIX_BLOCK - n)]
    blocks = jnp.pad(x, pad).reshape(x.shape[:-1] + (nb, PREFIX_BLOCK))
    within = blocks @ jnp.triu(jnp.ones((PREFIX_BLOCK, PREFIX_BLOCK), x.dtype))
    totals = within[..., -1]
    out = within + (jnp.cumsum(totals, axis=-1) - totals)[..., None]
    return out.reshape(x.shape[:-1] + (nb * PREFIX_BLOCK,))[..., :n]
