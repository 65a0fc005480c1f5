"""CP for MLA: zigzag layout, exactness vs the single-device attention, HLO all-gather bytes (docs/SPEC.md §2)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from horizon.model import mla, transformer
from horizon.parallel import context, sharded
from horizon.parallel import mesh as pmesh
from horizon.train import lm
from tests.parallel.conftest import mesh_cfg


def test_zigzag_layout_owns_chunks_i_and_mirror():
    S, cp = 16, 2
    idx = context.zigzag_indices(S, cp)
    # 4 chunks of 4; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    np.testing.assert_array_equal(idx.reshape(cp, -1)[0], [0, 1, 2, 3, 12, 13, 14, 15])
    np.testing.assert_array_equal(idx.reshape(cp, -1)[1], [4, 5, 6, 7, 8, 9, 10, 11])
    x = jnp.arange(2 * S).reshape(2, S)
    np.testing.assert_array_equal(context.zigzag_unpermute(context.zigzag_permute(x, 4), 4), x)
    # balanced causal work: every rank sees the same number of (query, key<=query) pairs
    for cp in (2, 4):
        per_rank = context.zigzag_indices(64, cp).reshape(cp, -1)
        work = [(r + 1).sum() for r in per_rank]
        assert len(set(work)) == 1, work
    with pytest.raises(ValueError, match="divisible"):
        context.zigzag_indices(30, 4)


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_zigzag_shift_left_is_the_natural_shift_in_the_layout(cp):
    x = jnp.arange(2 * 32).reshape(2, 32)
    for k in (1, 3):
        want = context.zigzag_permute(jnp.concatenate([x[:, k:], jnp.full((2, k), -1)], axis=1), cp)
        np.testing.assert_array_equal(context.zigzag_shift_left(context.zigzag_permute(x, cp), k, cp, fill=-1), want)


@pytest.fixture(scope="module")
def cp_setup(need8):
    cfg = sharded.configure(mesh_cfg("fsdp4xcp2"))
    mesh = pmesh.make_mesh(cfg.mesh)
    params = transformer.init(jax.random.key(1), cfg.model)
    p = jax.tree.map(lambda a: a[0], params["dense"]["attn"])  # one layer's attention
    return cfg, mesh, p


def _cp_fn(cfg, mesh):
    cp = mesh.shape["context"]

    def f(p, x, pos, seg):  # natural order in and out; zigzag inside (the model's layout)
        def z(a):
            return context.zigzag_permute(a, cp)

        out = context.cp_attention(p, z(x), z(pos), z(seg), cfg=cfg.model)
        return context.zigzag_unpermute(out, cp)

    def run(*a):
        with jax.set_mesh(mesh):
            return jax.jit(f)(*a)

    return f, run


def test_cp_attention_matches_local(cp_setup, batch):
    cfg, mesh, p = cp_setup
    x = jax.random.normal(jax.random.key(2), (8, 32, cfg.model.d_model))
    pos, seg = jnp.asarray(batch["positions"]), jnp.asarray(batch["segment_ids"])
    local_cfg = cfg.model.copy_and_resolve_references()
    local_cfg.attention_impl = "local"
    ref = jax.jit(lambda p, x: mla.attention(p, x, pos, seg, cfg=local_cfg))(p, x)
    _, run = _cp_fn(cfg, mesh)
    out = run(p, x, pos, seg)
    # f32 with "highest" matmuls; only the reduction order of softmax/einsum sums differs
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-5, atol=1e-6)
    # the segment mask matters (a causal-only implementation would fail the check above)
    bad = jax.jit(lambda p, x: mla.attention(p, x, pos, jnp.zeros_like(seg), cfg=local_cfg))(p, x)
    assert float(jnp.max(jnp.abs(bad - ref))) > 1e-3


def test_cp_blockwise_equals_local_dense_forward_and_gradients(cp_setup, batch):
    """CP (zigzag over 2 context ranks of the 8-device mesh, key/query blocks of 4: the rank's early
    chunk skips later key blocks) equals the local dense reference kernel, values and gradients."""
    cfg, mesh, p = cp_setup
    cp_cfg = cfg.copy_and_resolve_references()
    cp_cfg.model.attention_block_q = cp_cfg.model.attention_block_kv = 4
    dense = cfg.model.copy_and_resolve_references()
    dense.attention_impl, dense.attention_kernel = "local", "dense"
    x = jax.random.normal(jax.random.key(2), (8, 32, cfg.model.d_model))
    w = jax.random.normal(jax.random.key(3), x.shape)
    pos, seg = jnp.asarray(batch["positions"]), jnp.asarray(batch["segment_ids"])
    f, _ = _cp_fn(cp_cfg, mesh)

    def value_and_grads(attn):
        return jax.value_and_grad(lambda p, x: jnp.sum(attn(p, x) * w), argnums=(0, 1))

    with jax.set_mesh(mesh):
        got = jax.jit(value_and_grads(lambda p, x: f(p, x, pos, seg)))(p, x)
    want = jax.jit(value_and_grads(lambda p, x: mla.attention(p, x, pos, seg, cfg=dense)))(p, x)
    # f32; sums reassociated by the blockwise online softmax and the gather (as above)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), got, want)


def _all_gathers(hlo: str):
    """(result dtype, result shape, gather dim) of every all-gather in optimized HLO text."""
    out = []
    for m in re.finditer(r"= (\w+)\[([\d,]*)\][^ ]* all-gather\((.*?)\), .*?dimensions=\{(\d+)\}", hlo):
        out.append((m.group(1), tuple(int(d) for d in m.group(2).split(",") if d), int(m.group(4))))
    return out


def test_cp_all_gather_moves_only_latents(cp_setup, batch):
    """Compiled HLO: the only float all-gather is [b_local, S, Rkv + rope] (not per-head K/V)."""
    cfg, mesh, p = cp_setup
    m = cfg.model
    cp = mesh.shape["context"]
    x = jax.random.normal(jax.random.key(2), (8, 32, m.d_model))
    pos, seg = jnp.asarray(batch["positions"]), jnp.asarray(batch["segment_ids"])
    f, _ = _cp_fn(cfg, mesh)
    rep = pmesh.replicated(mesh)
    with jax.set_mesh(mesh):
        hlo = jax.jit(f, in_shardings=(rep, pmesh.batch_sharding(mesh, 3), pmesh.batch_sharding(mesh),
                                       pmesh.batch_sharding(mesh))).lower(p, x, pos, seg).compile().as_text()
    gathers = _all_gathers(hlo)
    b_local = 8 // (mesh.shape["data"] * mesh.shape["fsdp"] * mesh.shape["expert"])
    latent = m.kv_lora_rank + m.qk_rope_head_dim
    floats = [g for g in gathers if g[0] in ("f32", "bf16")]
    assert floats == [("f32", (b_local, 32, latent), 1)], gathers
    ints = [g for g in gathers if g[0] == "s32"]
    assert ints == [("s32", (b_local, 32), 1)], gathers  # segment ids
    latent_bytes = b_local * (32 // cp) * latent * 4
    kv_bytes = b_local * (32 // cp) * m.num_heads * (m.qk_nope_head_dim + m.v_head_dim) * 4
    assert latent_bytes < kv_bytes / 3  # the reason for gathering latents (tiny: 40 vs 128 per token)


def test_mtp_with_cp_equals_mtp_without(need8, batch):
    """MTP co-trained under CP (zigzag over 2 context ranks of the 8-device mesh): the LM and MTP losses
    and every gradient equal the single-device step's; the shifts run on true positions."""
    cfg = mesh_cfg("fsdp4xcp2")
    cfg.model.mtp_depth = 2
    cfg.model.attention_block_q = cfg.model.attention_block_kv = 8
    c = sharded.configure(cfg)
    mesh = pmesh.make_mesh(c.mesh)
    params = transformer.init(jax.random.key(0), cfg.model)
    b = {k: jnp.asarray(v) for k, v in batch.items()}

    def value_and_grad(loss_fn):
        return jax.jit(jax.value_and_grad(lambda p: loss_fn(p), has_aux=True))(params)

    with jax.set_mesh(mesh):
        (_, got), g_got = value_and_grad(lambda p: lm.mesh_losses(p, b, cfg=c, mesh=mesh))
    (_, want), g_want = value_and_grad(lambda p: lm.losses(p, b, cfg=cfg))
    assert float(want["mtp_loss"]) > 0
    # f32; the layouts reassociate sums (attention blocks, the gather, the token-sum losses)
    for k in ("loss", "mtp_loss", "tokens"):
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, err_msg=k)
    jax.tree.map(lambda a, w: np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-6), g_got, g_want)
