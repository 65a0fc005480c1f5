"""Parameter counting without allocation (`jax.eval_shape` of `transformer.init`) (docs/SPEC.md §1).

``total``: every array in the tree (incl. router bias and MTP modules).
``active``: parameters touched per token: total minus the ``E - k`` routed experts a token does not use
in every MoE layer (and MTP MoE block). Embedding and LM head are counted in both, matching the public
Kimi-K2 figure (1.04T total / 32.6B activated: its activated count includes the 2 x 1.17B embedding
and output matrices; see tests/model/test_model_params_loss.py).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from horizon.model import transformer


def count_params(cfg) -> dict:
    """dict(total=..., active=..., embedding=..., routed_expert=...) as Python ints."""
    c = transformer.model_cfg(cfg)
    shapes = jax.eval_shape(lambda k: transformer.init(k, c), jax.random.key(0))
    total = sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))
    routed = 0  # all routed-expert params
    for path, x in jax.tree_util.tree_leaves_with_path(shapes):
        if any(getattr(k, "key", None) == "experts" for k in path):
            routed += math.prod(x.shape)
    E, k = c.num_experts, c.num_experts_per_tok
    inactive = routed * (E - k) // E if E else 0
    emb = math.prod(shapes["embed"].shape) + (math.prod(shapes["lm_head"].shape) if "lm_head" in shapes else 0)
    return dict(total=total, active=total - inactive, embedding=emb, routed_expert=routed)


def numpy_init(cfg, seed: int) -> dict:
    """`transformer.init`'s shapes, drawn with numpy: normal(0, init_std), norms 1, router_bias 0.

    Deterministic in `seed` without compiling anything, so separate processes (async trainer and
    rollout workers) and tests rebuild identical params cheaply.
    """
    mcfg = transformer.model_cfg(cfg)
    shapes = jax.eval_shape(lambda k: transformer.init(k, mcfg), jax.random.key(0))
    rng = np.random.default_rng(seed)

    def leaf(path, s):
        name = str(getattr(path[-1], "key", ""))
        if name.endswith("norm"):
            return jnp.ones(s.shape, s.dtype)
        if name == "router_bias":
            return jnp.zeros(s.shape, s.dtype)
        return jnp.asarray(rng.normal(0.0, float(mcfg.init_std), s.shape), s.dtype)

    return jax.tree_util.tree_map_with_path(leaf, shapes)



def train_step_flops(cfg, batch: int, seq: int) -> dict:
    """Analytic FLOPs of one LM train step (forward + backward = 3x forward) on ``batch x seq`` tokens
    (docs/SPEC.md §1; the yardstick for `compiled.cost_analysis()`):

    * ``matmul``: 6 x active non-embedding, non-LM-head params x tokens (every weight matmul a token
      touches: attention projections, dense MLPs, router, shared and the k routed experts, MTP);
    * ``attention``: 6 x layers x heads x (qk_head_dim + v_head_dim) x batch x seq^2 (scores and
      P.V over the full ``seq x seq`` block the training attention computes; the causal mask is
      applied, not skipped);
    * ``lm_head``: 6 x tokens x d_model x vocab.

    Returns the three terms, their ``total`` and ``tokens``."""
    c = transformer.model_cfg(cfg)
    tokens = int(batch) * int(seq)
    counts = count_params(c)
    D, V = int(c.d_model), int(c.vocab_size)
    emb = V * D                                        # the input table (a lookup, no FLOPs)
    head = 0 if c.tie_embeddings else V * D            # an untied output matrix (counted as lm_head)
    body = counts["active"] - emb - head
    qk = int(c.qk_nope_head_dim) + int(c.qk_rope_head_dim)
    out = dict(matmul=6.0 * body * tokens,
               attention=6.0 * int(c.num_layers) * int(c.num_heads) * (qk + int(c.v_head_dim)) * int(batch)
               * int(seq) ** 2,
               lm_head=6.0 * tokens * D * V)
    out["total"] = sum(out.values())
    out["tokens"] = tokens
    return out
