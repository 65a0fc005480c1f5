"""The RL sampler runs sharded end to end: greedy `generate` with params placed by the mesh rules and
the batch / latent KV cache split over the batch axes == the single-device run (docs/SPEC.md §2, §4)."""

import jax
import numpy as np
import pytest

from horizon.inference import sampler
from horizon.model import transformer
from horizon.parallel import mesh as pmesh
from horizon.parallel import sharded
from tests.parallel.conftest import mesh_cfg

NEW = 5  # generated tokens per row (the decode step compiles once; few steps keep it fast)


@pytest.fixture(scope="module")
def reference(need8):
    cfg = mesh_cfg("")
    params = transformer.init(jax.random.key(5), cfg.model)
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 256, n).astype(np.int32) for n in (3, 9, 5, 12, 1, 7, 10, 4)]  # ragged, batch 8
    # greedy (temperature 0) and no stop tokens: every row generates NEW tokens, so all of them compare
    kw = dict(max_new_tokens=NEW, sampling=sampler.SamplerConfig(temperature=0.0, stop_tokens=()))
    ref = sampler.generate(params, prompts, jax.random.key(0), cfg=cfg, **kw)
    return params, prompts, kw, ref


@pytest.mark.parametrize("preset", ["dp8", "fsdp4xcp2", pytest.param("ep8", marks=pytest.mark.slow)])
def test_sharded_greedy_generate_equals_single_device(preset, reference):
    params, prompts, kw, ref = reference
    cfg = mesh_cfg(preset)
    mesh = pmesh.run_mesh(cfg)
    p_sh = sharded.place_params(params, cfg, mesh)
    if preset != "dp8":  # the rules really split the weights (dp8 replicates them by design)
        assert not p_sh["embed"].sharding.is_fully_replicated
    out = sampler.generate(p_sh, prompts, jax.random.key(0), cfg=cfg, **kw)   # the config's mesh shards the call
    for i in range(len(prompts)):
        np.testing.assert_array_equal(out.tokens[i], ref.tokens[i], err_msg=f"row {i}")
        assert len(out.tokens[i]) == NEW
        # f32 with "highest" matmuls: the sharded run does the same arithmetic per row; only reduction
        # order differs (FSDP-gathered / batch-split matmuls, log_softmax over the same vocab), ~1e-6
        np.testing.assert_allclose(out.logprobs[i], ref.logprobs[i], rtol=1e-5, atol=1e-5, err_msg=f"row {i}")
        # the routing that RL replays is the same too (prompt and generated tokens)
        np.testing.assert_array_equal(out.router_indices[i], ref.router_indices[i])
        np.testing.assert_array_equal(out.prompt_router_indices[i], ref.prompt_router_indices[i])

    # the compiled decode step is partitioned: the latent cache comes out split on its batch dim over
    # the batch axes, in the layout it went in (so the donated cache keeps one layout across steps) ...
    P_, N_ = sampler.bucket(max(len(p) for p in prompts), 16), sampler.bucket(NEW, 16)  # generate's buckets
    compiled = sampler.lower_decode_step(p_sh, cfg, 8, P_ + N_)
    nb = 8 // mesh.shape["context"]
    for got, want in zip(jax.tree.leaves(compiled.output_shardings[0]),
                         jax.tree.leaves(compiled.input_shardings[0][1])):
        assert got.is_equivalent_to(want, 4), (got, want)
        assert got.shard_shape((2, 8, P_ + N_, 8 * mesh.shape["context"]))[1] == 8 // nb, got  # rows / device
    coll = sharded.collective_bytes(compiled.as_text())
    param_bytes = sum(a.nbytes for a in jax.tree.leaves(params))
    if preset == "dp8":
        # ... pure DP moves no weights: the only collectives are routing-sized (the local MoE block's
        # sort-based dispatch groups the whole batch's T*k assignments, so GSPMD gathers those few rows)
        assert sum(coll.values()) < param_bytes / 100, (coll, param_bytes)
    else:  # ... split weights are communicated inside the step (GSPMD inserted the collectives)
        assert coll["all-gather"] + coll["all-reduce"] > 0, coll

def test_sampling_config_uses_plain_paths_and_rejects_uneven_batch(need8):
    cfg = mesh_cfg("ep4xcp2")
    assert sharded.configure(cfg).model.moe_impl != "local"  # the training config would use shard_maps
    c = sharded.sampling_config(cfg)
    assert (c.model.attention_impl, c.model.moe_impl) == ("local", "local")
    mesh = pmesh.make_mesh(cfg.mesh)
    place = sharded.sampling_placer(mesh)
    x = np.zeros((6, 4), np.int32)  # 6 rows over 4 batch shards
    with pytest.raises(ValueError, match="not divisible"):
        place({}, x, x[:, 0])
