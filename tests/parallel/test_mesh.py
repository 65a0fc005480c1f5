"""Mesh axes and the one sharding-rules table (docs/SPEC.md §2)."""

import jax
import pytest
from jax.sharding import PartitionSpec as P

from horizon.model import transformer
from horizon.parallel import mesh as pmesh
from tests.parallel.conftest import mesh_cfg


def _shapes(cfg):
    return jax.eval_shape(lambda k: transformer.init(k, cfg.model), jax.random.key(0))


@pytest.mark.parametrize("preset", ["dp8", "fsdp4xcp2", "ep4xcp2", "ep8"])
def test_presets_build_8_device_meshes(preset, need8):
    cfg = mesh_cfg(preset)
    mesh = pmesh.make_mesh(cfg.mesh)
    assert mesh.axis_names == pmesh.AXES and mesh.size == 8
    assert dict(mesh.shape) == pmesh.PRESETS[preset]


def test_dense_and_expert_weights_shard_differently(need8):
    cfg = mesh_cfg("ep4xcp2")
    mesh = pmesh.make_mesh(cfg.mesh)
    specs = pmesh.param_specs(_shapes(cfg), cfg, mesh)
    # expert weights [L, E, D, F]: experts on the expert axis, embed on the rest (CP folded into FSDP)
    assert specs["moe"]["moe"]["experts"]["gate"] == P(None, "expert", "context", None)
    assert specs["moe"]["moe"]["experts"]["down"] == P(None, "expert", "context", None)  # moe_mlp first
    # dense weights: embed over every non-data axis (expert acts as DP for them)
    assert specs["dense"]["mlp"]["gate"] == P(None, ("context", "expert"), None)
    assert specs["moe"]["attn"]["wkv_b"] == P(None, None, ("context", "expert"))
    assert specs["embed"] == P(("context", "expert"), None)  # vocab first, embed then finds axes used


def test_cp_folded_into_fsdp_and_dp_replicates(need8):
    cfg = mesh_cfg("fsdp4xcp2")
    mesh = pmesh.make_mesh(cfg.mesh)
    shapes = _shapes(cfg)
    specs = pmesh.param_specs(shapes, cfg, mesh)
    assert specs["dense"]["mlp"]["up"] == P(None, ("fsdp", "context"), None)
    sh = pmesh.param_shardings(shapes, cfg, mesh)
    full = pmesh.bytes_per_device(shapes, pmesh.param_shardings(shapes, mesh_cfg("dp8"), mesh))
    assert pmesh.bytes_per_device(shapes, sh) < full / 4  # 8-way split of all large weights
    dp = mesh_cfg("dp8")
    dmesh = pmesh.make_mesh(dp.mesh)
    assert all(s == P(*([None] * len(s))) for s in jax.tree.leaves(
        pmesh.param_specs(shapes, dp, dmesh), is_leaf=lambda s: isinstance(s, P)))


def test_divisibility_fallback_and_errors(need8):
    cfg = mesh_cfg("ep8")
    mesh = pmesh.make_mesh(cfg.mesh)
    rules = pmesh.rules_for(cfg.mesh)
    assert pmesh.logical_to_spec(("embed",), (12,), rules, mesh) == P(None)  # 12 % 8 != 0 -> replicated
    assert pmesh.logical_to_spec(("embed", "mlp"), (64, 16), rules, mesh) == P("expert", None)
    with pytest.raises(ValueError, match="no sharding rule"):
        pmesh.logical_to_spec(("bogus",), (8,), rules, mesh)
    bad = mesh_cfg("nope")
    with pytest.raises(ValueError, match="unknown mesh preset"):
        pmesh.make_mesh(bad.mesh)
    explicit = mesh_cfg("")
    explicit.mesh.fsdp = 3
    with pytest.raises(ValueError, match="needs 3 devices"):
        pmesh.make_mesh(explicit.mesh)


def test_sharding_table_lists_every_param(need8):
    cfg = mesh_cfg("ep4xcp2")
    mesh = pmesh.make_mesh(cfg.mesh)
    shapes = _shapes(cfg)
    table = pmesh.sharding_table(shapes, cfg, mesh)
    assert len(table.splitlines()) == 2 + len(jax.tree.leaves(shapes))
    assert "moe/moe/experts/gate" in table and "'expert'" in table
