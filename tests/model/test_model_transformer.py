"""Transformer / MLA behaviour: decode == training forward, packing isolation, config errors, axes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_testlib import tiny_cfg, variant_cfg

from horizon.model import transformer

# Decode vs training forward: both paths run in float32 with "highest" matmul precision (conftest);
# they differ only in contraction order (absorbed W_uk/W_uv vs materialised per-head K/V), i.e.
# rounding of sums of <= 64 terms: ~1e-7 relative. Logits are O(0.5); 2e-5 absolute leaves margin
# while any real bug (mask off by one, missing mscale, wrong slot) moves logits by >= 1e-3.
DEC_ATOL = 2e-5
S = 8  # one sequence length everywhere: every new shape is another XLA compile


def _token_by_token(m, tokens, max_len):
    b, s = tokens.shape
    cache = transformer.init_cache(m.cfg, b, max_len)
    outs, idx = [], []
    for i in range(s):
        lg, cache, aux = m.decode(m.params, cache, tokens[:, i:i + 1], jnp.full((b, 1), i, jnp.int32))
        outs.append(lg)
        idx.append(aux["router_indices"])
    return jnp.concatenate(outs, axis=1), cache, jnp.stack(idx, 2)


@pytest.mark.parametrize("which", ["tiny", "variant"])
def test_decode_matches_forward(which, request):
    """tiny: low-rank q, no YaRN, 1 dense + 2 MoE layers; variant: full-rank q, YaRN, 0 dense + 2 MoE."""
    m = request.getfixturevalue(which)
    tokens = m.tokens(2, S)
    ref, aux = m.full(tokens)
    dec, cache, idx = _token_by_token(m, tokens, max_len=S + 3)
    np.testing.assert_allclose(np.asarray(dec), np.asarray(ref), atol=DEC_ATOL, rtol=0)
    # Decode returns the same routing as the training forward (row-major b*s flattening).
    L, b, s = idx.shape[0], 2, S
    np.testing.assert_array_equal(np.asarray(idx).reshape(L, b, s, -1),
                                  np.asarray(aux["router_indices"]).reshape(L, b, s, -1))
    # Cache holds only the latent and the rope key.
    for group in cache.values():
        assert set(group) == {"c_kv", "k_rope"}
        assert group["c_kv"].shape[-1] == m.cfg.kv_lora_rank and group["k_rope"].shape[-1] == m.cfg.qk_rope_head_dim


def test_chunked_prefill_matches_forward(tiny):
    """Prefill 5 tokens in one call, then decode the rest one by one."""
    tokens = tiny.tokens(2, S, seed=3)
    ref, _ = tiny.full(tokens)
    cache = transformer.init_cache(tiny.cfg, 2, S + 3)
    outs = []
    for start, n in ((0, 5), (5, 1), (6, 1), (7, 1)):
        pos = jnp.broadcast_to(jnp.arange(start, start + n), (2, n))
        lg, cache, _ = tiny.decode(tiny.params, cache, tokens[:, start:start + n], pos)
        outs.append(lg)
    np.testing.assert_allclose(np.asarray(jnp.concatenate(outs, 1)), np.asarray(ref), atol=DEC_ATOL, rtol=0)


def test_segments_are_isolated(tiny):
    """Row 0 packs [A (3) | B (5)]; row 1 packs [B (5) | A' (3)]. B's logits must match across rows,
    and must not change when A is replaced."""
    A = tiny.tokens(1, 3, seed=10)[0]
    A2 = tiny.tokens(1, 3, seed=11)[0]
    B = tiny.tokens(1, 5, seed=12)[0]
    toks = jnp.stack([jnp.concatenate([A, B]), jnp.concatenate([B, A2])])
    seg = jnp.array([[0] * 3 + [1] * 5, [0] * 5 + [1] * 3])
    pos = transformer.default_positions(toks, seg)
    np.testing.assert_array_equal(np.asarray(pos[0]), [0, 1, 2, 0, 1, 2, 3, 4])
    logits, _ = tiny.forward(tiny.params, toks, pos, seg)
    # Same math on the same values; only summation/blocking inside XLA kernels may differ -> 1e-6.
    np.testing.assert_allclose(np.asarray(logits[0, 3:]), np.asarray(logits[1, :5]), atol=1e-6, rtol=0)
    toks2 = toks.at[0, :3].set(A2)
    logits2, _ = tiny.forward(tiny.params, toks2, pos, seg)
    np.testing.assert_allclose(np.asarray(logits2[0, 3:]), np.asarray(logits[0, 3:]), atol=1e-6, rtol=0)
    assert not np.allclose(np.asarray(logits2[0, :3]), np.asarray(logits[0, :3]), atol=1e-4)  # A did change


def test_forward_outputs(tiny):
    tokens = tiny.tokens(2, S)
    logits, aux = tiny.full(tokens)
    c = tiny.cfg
    assert logits.dtype == jnp.float32 and logits.shape == (2, S, c.vocab_size)
    n_moe = c.num_layers - c.first_k_dense
    assert aux["router_indices"].shape == (n_moe, 2 * S, c.num_experts_per_tok)
    assert aux["router_indices"].dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(aux["router_load"].sum(-1)), 2 * S * c.num_experts_per_tok)
    assert aux["hidden"].shape == (2, S, c.d_model)
    # hidden is before final_norm: re-applying norm + head reproduces the logits.
    np.testing.assert_allclose(
        np.asarray(jax.jit(lambda p, h: transformer.lm_logits(p, h, cfg=c))(tiny.params, aux["hidden"])),
        np.asarray(logits), atol=1e-6)


def test_all_dense_and_bf16_forward():
    c = tiny_cfg()
    c.num_experts = 0
    c.num_layers = 1
    c.dtype = "bfloat16"
    c.param_dtype = "bfloat16"
    p = jax.eval_shape(lambda k: transformer.init(k, c), jax.random.key(0))
    assert set(p) == {"embed", "final_norm", "lm_head", "dense"}
    assert p["dense"]["attn"]["wq_a"].dtype == jnp.bfloat16
    # Trace only (a full bf16 compile costs seconds on CPU): dtypes and shapes of the bf16 path.
    logits, aux = jax.eval_shape(lambda p, t: transformer.forward(p, t, cfg=c), p, jnp.ones((1, 4), jnp.int32))
    assert logits.dtype == jnp.float32 and aux["hidden"].dtype == jnp.bfloat16
    assert aux["router_indices"].shape == (0, 4, c.num_experts_per_tok)


@pytest.mark.parametrize("field,value,msg", [
    ("num_experts_per_tok", 9, "num_experts_per_tok"),
    ("n_group", 3, "divisible by n_group"),
    ("topk_group", 3, "topk_group"),
    ("qk_rope_head_dim", 7, "even"),
    ("v_head_dim", 0, "v_head_dim"),
    ("first_k_dense", 4, "first_k_dense"),
    ("dtype", "float8", "dtype"),
    ("moe_precision", "int4", "moe_precision"),
])
def test_bad_config_raises(field, value, msg):
    c = tiny_cfg()
    c[field] = value
    with pytest.raises(ValueError, match=msg):
        transformer.init(jax.random.key(0), c)


def test_group_limit_infeasible_raises():
    c = tiny_cfg()
    c.num_experts_per_tok = 5  # one group of 4 experts cannot supply 5
    with pytest.raises(ValueError, match="topk_group"):
        transformer.validate_config(c)


def test_replay_shape_checked(tiny):
    with pytest.raises(ValueError, match="replay_indices"):
        transformer.forward(tiny.params, jnp.zeros((1, 4), jnp.int32), cfg=tiny.cfg,
                            replay_indices=jnp.zeros((2, 3, 2), jnp.int32))


@pytest.mark.parametrize("cfg_fn", [tiny_cfg, variant_cfg])
def test_logical_axes_and_trainable_mask(cfg_fn):
    c = cfg_fn()
    shapes = jax.eval_shape(lambda k: transformer.init(k, c), jax.random.key(0))
    axes = transformer.param_logical_axes(c)
    is_axes = lambda x: isinstance(x, tuple)  # noqa: E731
    assert jax.tree.structure(axes, is_leaf=is_axes) == jax.tree.structure(shapes)
    for a, s in zip(jax.tree.leaves(axes, is_leaf=is_axes), jax.tree.leaves(shapes)):
        assert len(a) == len(s.shape), (a, s.shape)
    assert axes["moe"]["moe"]["experts"]["gate"] == ("layers", "expert", "embed", "moe_mlp")
    mask = transformer.trainable_mask(shapes)
    flat = jax.tree_util.tree_leaves_with_path(mask)
    frozen = [jax.tree_util.keystr(p) for p, v in flat if not v]
    assert frozen and all(f.endswith("['router_bias']") for f in frozen)
    assert sum(1 for _, v in flat if v) == len(flat) - len(frozen)


def test_remat_gives_the_same_gradients():
    """`model.remat` only changes what the backward keeps: gradients match without it. Both recompute
    the same float32 ops in the same order, so any difference is rounding of fused vs unfused
    evaluation (~1e-7 relative); 1e-5 relative still catches a dropped or mis-wired layer."""
    cfg = tiny_cfg()
    params = transformer.init(jax.random.key(0), cfg)
    tokens = jax.random.randint(jax.random.key(1), (2, S), 0, cfg.vocab_size)

    def grads(remat):
        c = tiny_cfg()
        c.remat = remat

        def loss(p):
            logits, _ = transformer.forward(p, tokens, cfg=c)
            return jnp.mean(jax.nn.log_softmax(logits)[..., 0] ** 2)
        return jax.jit(jax.grad(loss))(params)

    for a, b in zip(jax.tree.leaves(grads(False)), jax.tree.leaves(grads(True))):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-9)
    for remat in (False, True):                                   # and it is applied only when asked for
        c = tiny_cfg()
        c.remat = remat
        # a default arg (c=c) would become a traced input of make_jaxpr
        jaxpr = str(jax.make_jaxpr(lambda p: transformer.forward(p, tokens, cfg=c)[0])(params))  # noqa: B023 - traced within the iteration
        assert ("remat" in jaxpr or "checkpoint" in jaxpr) == remat      # the primitive's name varies by version
