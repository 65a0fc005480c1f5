"""Parameter counting without allocation (`jax.eval_shape` of `transformer.init`) (SPEC §1).

``total``: every array in the tree (incl. router bias and MTP modules).
``active``: parameters touched per token: total minus the ``E - k`` routed experts a token does not use
in every MoE layer (and MTP MoE block). Embedding and LM head are counted in both, matching the public
Kimi-K2 figure (1.04T total / 32.6B activated: its activated count includes the 2 x 1.17B embedding
and output matrices; see tests/model/test_params.py).
"""

from __future__ import annotations

import math

import jax

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
    import jax.numpy as jnp
    import numpy as np

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

