"""The grouped expert GEMM (`horizon.quant.grouped`) is `jax.lax.ragged_dot` at the FLOPs it needs:
values and both gradients equal ragged_dot's on ragged groups (empty groups, one group holding every
row, rows past sum(group_sizes)), float32 and bfloat16; its compiled FLOPs for 2048 routed rows over
32 experts stay within 1.5x of the grouped ideal while ragged_dot's are ~32x (docs/SPEC.md §1)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from horizon.quant import grouped

K, N, G = 24, 40, 6


def _case(kind: str, M: int = 64, seed: int = 0):
    rng = np.random.default_rng(seed)
    if kind == "ragged":            # random sizes, two empty groups, 5 unassigned trailing rows
        gs = rng.multinomial(M - 5, np.ones(G) / G)
        gs[[1, 4]] = 0
        gs[0] += M - 5 - gs.sum()
    elif kind == "one_group":       # every row in one expert
        gs = np.zeros(G, np.int64)
        gs[2] = M
    else:                           # "all_empty": no row assigned (the EP path's empty receive buffer)
        gs = np.zeros(G, np.int64)
    x = rng.normal(size=(M, K)).astype(np.float32)
    w = rng.normal(size=(G, K, N)).astype(np.float32)
    dy = rng.normal(size=(M, N)).astype(np.float32)
    return jnp.asarray(x), jnp.asarray(w), jnp.asarray(gs, jnp.int32), jnp.asarray(dy)


def _vjp(f, x, w, dy):
    y, pull = jax.vjp(f, x, w)
    return (y, *pull(dy))


@pytest.fixture(params=["loop", "batched"])
def schedule(request, monkeypatch):
    """Both schedules of the tile products (`grouped.BATCHED_MAX_BYTES`): a loop over tiles, or one
    batched product over gathered weights (what this backend runs at these small sizes)."""
    monkeypatch.setitem(grouped.BATCHED_MAX_BYTES, jax.default_backend(), 0 if request.param == "loop" else 1 << 40)
    return request.param


@pytest.mark.parametrize("kind", ["ragged", "one_group", "all_empty"])
@pytest.mark.parametrize("block", [None, 8, 32])
def test_block_gemm_equals_ragged_dot_values_and_grads(kind, block, schedule):
    x, w, gs, dy = _case(kind)
    ref = _vjp(lambda a, b: jax.lax.ragged_dot(a, b, gs, precision="highest"), x, w, dy)
    got = _vjp(lambda a, b: grouped.grouped_matmul(a, b, gs, impl="block", block=block, precision="highest"),
               x, w, dy)
    for name, r, g in zip(("y", "dx", "dw"), ref, got):
        # float32 "highest" GEMMs over the same K (y, dx) / the same rows (dw): only summation order
        # differs, ~1e-6 relative; atol for entries that cancel to ~0
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-5 * float(jnp.abs(r).max() + 1),
                                   err_msg=f"{kind} {name}")
    n = int(gs.sum())
    assert not np.asarray(got[0][n:]).any()          # rows past sum(group_sizes) give exactly 0
    assert not np.asarray(got[1][n:]).any()          # ... and get no gradient


def test_block_gemm_bfloat16_matches_ragged_dot(schedule):
    x, w, gs, dy = _case("ragged", M=96, seed=1)
    xb, wb = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    ref = jax.lax.ragged_dot(xb, wb, gs, preferred_element_type=jnp.float32)
    got = grouped.grouped_matmul(xb, wb, gs, impl="block")
    assert got.dtype == jnp.bfloat16
    # both accumulate the K=24 bf16 products in f32; the block path then rounds to bf16 once (2^-8 relative)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(ref), rtol=2 ** -7, atol=2 ** -7)
    gx = jax.grad(lambda a: grouped.grouped_matmul(a, wb, gs, impl="block").astype(jnp.float32).sum())(xb)
    rx = jax.grad(lambda a: jax.lax.ragged_dot(a, wb, gs).astype(jnp.float32).sum())(xb)
    np.testing.assert_allclose(np.asarray(gx, np.float32), np.asarray(rx, np.float32), rtol=2 ** -6, atol=2 ** -6)


def test_compiled_flops_are_the_grouped_ideal_not_every_expert():
    M, K_, N_, G_ = 2048, 512, 256, 32
    x = jax.ShapeDtypeStruct((M, K_), jnp.float32)
    w = jax.ShapeDtypeStruct((G_, K_, N_), jnp.float32)
    gs = jax.ShapeDtypeStruct((G_,), jnp.int32)
    ideal = 2.0 * M * K_ * N_

    def flops(impl):
        with grouped.count_flops():       # the tile loop unrolled: cost_analysis then counts every tile
            f = jax.jit(lambda a, b, g: grouped.grouped_matmul(a, b, g, impl=impl))
            return f.lower(x, w, gs).compile().cost_analysis()["flops"]

    block, rd = flops("auto"), flops("ragged_dot")
    print(f"compiled FLOPs: block {block:.3g} ({block / ideal:.2f}x ideal), ragged_dot {rd:.3g} ({rd / ideal:.1f}x)")
    assert block <= 1.5 * ideal and rd > 10 * ideal
    with grouped.count_flops():           # and the backward (dx and dw tile loops): ~3x the forward
        g = jax.jit(jax.grad(lambda a, b, gg: grouped.grouped_matmul(a, b, gg).sum(), argnums=(0, 1)))
        back = g.lower(x, w, gs).compile().cost_analysis()["flops"]
    assert back <= 1.5 * 3 * ideal, back / ideal
    assert grouped.choose_impl("auto") == "block"


def test_bad_shapes_and_impl_fail_in_one_line():
    x, w, gs, _ = _case("ragged")
    with pytest.raises(ValueError, match="grouped_matmul wants"):
        grouped.grouped_matmul(x[:, :5], w, gs)
    with pytest.raises(ValueError, match="impl='dense'"):
        grouped.grouped_matmul(x, w, gs, impl="dense")


@pytest.mark.parametrize("kind", ["ragged", "one_group", "all_empty"])
def test_grouped_wgrad_equals_ragged_contraction(kind, schedule):
    """dw[g] = x_g^T dy_g (the MXFP8 backward's wgrad) == `ragged_dot_general` with a ragged contraction."""
    x, _, gs, dy = _case(kind)
    dn = jax.lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(((1,), (1,)), ((), ())),
                                           lhs_ragged_dimensions=[1], rhs_group_dimensions=[])
    ref = jax.lax.ragged_dot_general(x.T, dy.T, gs, dn, precision="highest")
    got = grouped.grouped_wgrad(x, dy, gs, precision="highest")
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5, atol=1e-5 * float(jnp.abs(ref).max() + 1))


def test_model_grouped_impl_reaches_the_moe_and_is_validated():
    """`model.grouped_impl` picks the expert GEMM (the per-model switch beside `AUTO_IMPL`): the tiny
    model's logits agree between "block" and "ragged_dot" (f32; only summation order differs, 1e-5),
    the field routes there (a spy on `grouped_matmul`'s impl) and a bad name fails validation."""
    from model_testlib import tiny_cfg

    from horizon.model import transformer
    from horizon.utils.config import ConfigError

    cfg = tiny_cfg()
    params = transformer.init(jax.random.key(0), cfg)
    toks = jax.random.randint(jax.random.key(1), (2, 16), 0, cfg.vocab_size)
    seen, real = [], grouped.grouped_matmul

    def spy(*a, impl="auto", **k):
        seen.append(impl)
        return real(*a, impl=impl, **k)

    logits = {}
    for impl in ("block", "ragged_dot"):
        cfg.grouped_impl = impl
        grouped.grouped_matmul = spy
        try:
            logits[impl] = transformer.forward(params, toks, cfg=cfg)[0]
        finally:
            grouped.grouped_matmul = real
        assert seen and set(seen) == {impl}
        seen.clear()
    np.testing.assert_allclose(np.asarray(logits["block"]), np.asarray(logits["ragged_dot"]), rtol=1e-5, atol=1e-5)
    cfg.grouped_impl = "dense"
    with pytest.raises(ConfigError, match="grouped_impl='dense'"):
        transformer.validate_config(cfg)


def test_schedule_follows_the_gathered_weight_size(schedule):
    """The tile products run as a loop (a `while` in the lowered program: the rest of the block GEMM
    has none) or as one batched product by `BATCHED_MAX_BYTES`, decided at trace time (the fixture
    sets the limit)."""
    x, w, gs, _ = _case("ragged")
    hlo = jax.jit(lambda a, b: grouped.grouped_matmul(a, b, gs, impl="block", block=8)).lower(x, w).as_text()
    assert ("while" in hlo) == (schedule == "loop")
