"""Parameter counts (no allocation) and the next-token loss."""

import math

import jax
import jax.numpy as jnp
import numpy as np
from model_testlib import REPO, tiny_cfg

from horizon.model import loss, transformer
from horizon.model.params import count_params
from horizon.utils.config import load_config_file


def test_kimi_k2_counts():
    cfg = load_config_file(REPO / "configs" / "kimi_k2.py")
    n = count_params(cfg)
    # Public figures: 1.04T total, 32B activated (the activated figure includes embedding + lm_head).
    assert abs(n["total"] / 1.04e12 - 1) < 0.03, n
    assert abs(n["active"] / 32e9 - 1) < 0.03, n
    assert abs(n["embedding"] - 2 * 163840 * 7168) == 0


def test_tiny_counts_match_arrays():
    c = tiny_cfg()
    n = count_params(c)
    shapes = jax.eval_shape(lambda k: transformer.init(k, c), jax.random.key(0))
    assert n["total"] == sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))
    per_expert = 3 * c.d_model * c.moe_mlp_dim
    n_moe = c.num_layers - c.first_k_dense
    assert n["total"] - n["active"] == n_moe * (c.num_experts - c.num_experts_per_tok) * per_expert


def test_next_token_loss_segments_and_mask():
    rng = np.random.default_rng(0)
    b, s, V = 2, 6, 7
    logits = jnp.asarray(rng.standard_normal((b, s, V)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, V, (b, s)))
    seg = jnp.array([[0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0]])
    mask = jnp.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    mean, count = loss.next_token_loss(logits, tokens, mask=mask, segment_ids=seg)
    lp = np.asarray(jax.nn.log_softmax(logits))
    # row 0: pairs (0,1),(1,2),(3,4),(4,5) (no 2->3 across segments); row 1: targets 1..3 (4,5 masked)
    pairs = [(0, 0), (0, 1), (0, 3), (0, 4), (1, 0), (1, 1), (1, 2)]
    ref = -np.mean([lp[r, t, int(tokens[r, t + 1])] for r, t in pairs])
    assert float(count) == len(pairs)
    np.testing.assert_allclose(float(mean), ref, rtol=1e-6)
