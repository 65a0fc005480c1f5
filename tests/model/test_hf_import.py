"""HF DeepSeek-V3 checkpoint import/export against the transformers reference forward (docs/SPEC.md §1).

torch/transformers are test-only. Every HF model here is a tiny random-init
`DeepseekV3ForCausalLM` built locally (no download), in float32.

Tolerance: logits are compared in float32 with matmul precision "highest" on both sides
(tests/conftest.py; torch CPU matmuls are true f32). The two frameworks sum in different orders
(XLA vs MKL GEMMs, ragged_dot vs per-expert loops, fused vs unfused softmax), so each op carries
~1e-7 relative rounding differences that grow through 3 layers to ~1e-6; a wrong weight mapping,
transpose, RoPE pairing or routing decision changes logits by >= 1e-2 relative. 1e-4 relative
(max |diff| / max |logit|) leaves two orders of margin on both sides.
"""

from __future__ import annotations

import json
import math
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from horizon.model import hf, transformer  # noqa: E402
from horizon.utils.config import load_config_file  # noqa: E402

REL_TOL = 1e-4  # see module docstring
SEQ, BATCH = 16, 2


def _tiny(variant: str):
    m = load_config_file("configs/tiny.py").model
    m.first_k_dense = 1
    m.n_group, m.topk_group = 2, 1  # group-limited routing on
    m.init_std = 0.1  # spread router scores: no near-ties between frameworks
    if variant == "qlora":
        m.q_lora_rank = 32
    elif variant == "yarn_fullq":
        m.q_lora_rank = 0
        m.rope_scaling.type = "yarn"
        m.rope_scaling.factor = 4.0
        m.rope_scaling.original_max_position_embeddings = 8
        m.max_seq_len = 32  # = factor * original (HF warns otherwise)
        m.rope_scaling.mscale = 1.0
        m.rope_scaling.mscale_all_dim = 0.5  # != mscale: cos/sin factor and softmax mscale^2 both differ from 1
    else:
        raise ValueError(variant)
    return m


def _hf_model(m, seed: int = 0):
    """Random tiny HF model; norms and router bias randomised so their mapping matters."""
    kw = hf.hf_config_from_model_config(m)
    return _hf_model_from_config(transformers.DeepseekV3Config(**kw, initializer_range=m.init_std), seed)


def _hf_model_from_config(hf_cfg, seed: int = 0):
    """`DeepseekV3ForCausalLM(hf_cfg)` (eager attention, eval mode) with norms and router bias randomised."""
    torch.manual_seed(seed)
    hf_cfg._attn_implementation = "eager"
    model = transformers.DeepseekV3ForCausalLM(hf_cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
        for layer in model.model.layers[hf_cfg.first_k_dense_replace:]:
            b = layer.mlp.gate.e_score_correction_bias
            b.copy_(0.1 * torch.randn_like(b))
    return model


def _hf_forward(model, tokens: np.ndarray):
    """Logits and per-MoE-layer chosen experts (hooked from DeepseekV3TopkRouter) of the HF model."""
    picked = []
    routers = [layer.mlp.gate for layer in model.model.layers
               if hasattr(layer.mlp, "gate") and hasattr(layer.mlp.gate, "e_score_correction_bias")]
    hooks = [r.register_forward_hook(lambda mod, inp, out: picked.append(out[2].numpy().copy())) for r in routers]
    with torch.no_grad():
        logits = model(torch.from_numpy(tokens).long()).logits.float().numpy()
    for h in hooks:
        h.remove()
    return logits, np.stack(picked)


_JITTED: dict = {}


def _horizon_forward(params, tokens, m):
    key = json.dumps(m.to_dict(), sort_keys=True)  # one compile per config across tests
    if key not in _JITTED:
        _JITTED[key] = jax.jit(lambda p, t, m=m: transformer.forward(p, t, cfg=m))
    logits, aux = _JITTED[key](params, jnp.asarray(tokens))
    return np.asarray(logits), np.asarray(aux["router_indices"])


def _rel_err(a, b) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def _tokens(m, seed=1, seq=SEQ):
    return np.random.default_rng(seed).integers(0, m.vocab_size, (BATCH, seq)).astype(np.int32)


def _trees_equal(a, b) -> bool:
    same_struct = jax.tree.structure(a) == jax.tree.structure(b)
    return same_struct and all(
        x.shape == y.shape and x.dtype == y.dtype and bool(np.array_equal(np.asarray(x), np.asarray(y)))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _random_params(m, seed: int) -> dict:
    """Random numpy params shaped like `transformer.init` (eval_shape only: no init compile)."""
    rng = np.random.default_rng(seed)
    spec = jax.eval_shape(lambda k: transformer.init(k, m), jax.random.PRNGKey(0))
    return jax.tree.map(lambda s: rng.normal(size=s.shape).astype(s.dtype), spec)


@pytest.fixture(scope="module", params=["qlora", "yarn_fullq"])
def saved(request, tmp_path_factory):
    m = _tiny(request.param)
    model = _hf_model(m)
    d = tmp_path_factory.mktemp(f"hf_{request.param}")
    model.save_pretrained(d)
    return m, model, d


def test_saved_layout_is_per_expert(saved):
    """transformers 5.x keeps experts fused in memory but save_pretrained writes the on-disk layout."""
    m, model, d = saved
    names = hf.CheckpointReader(d).keys()
    assert f"model.layers.{m.first_k_dense}.mlp.experts.0.gate_proj.weight" in names
    assert not any(n.endswith("experts.gate_up_proj") for n in names)
    assert set(names) == set(hf.iter_hf_names(m))


def test_logits_and_routing_match_transformers(saved):
    m, model, d = saved
    params = hf.load_hf_checkpoint(d, m)
    tokens = _tokens(m)
    ref_logits, ref_idx = _hf_forward(model, tokens)
    logits, idx = _horizon_forward(params, tokens, m)
    assert logits.shape == ref_logits.shape == (BATCH, SEQ, m.vocab_size)
    assert _rel_err(logits, ref_logits) < REL_TOL
    np.testing.assert_array_equal(np.sort(idx, -1), np.sort(ref_idx, -1))  # HF topk is unsorted

    # The test can fail on routing: the selection bias and group limit change the chosen experts.
    hf_layer = model.model.layers[m.first_k_dense]
    with torch.no_grad():
        h = [None]
        hk = hf_layer.mlp.register_forward_hook(lambda mod, inp, out: h.__setitem__(0, inp[0]))
        model(torch.from_numpy(tokens).long())
        hk.remove()
        scores = torch.sigmoid(h[0].reshape(-1, m.d_model) @ hf_layer.mlp.gate.weight.T).numpy()
    no_bias = np.sort(np.argsort(-scores, -1)[:, : m.num_experts_per_tok], -1)
    assert (no_bias != np.sort(ref_idx[0], -1)).any(), "bias/group limit never changed a choice"


def test_fused_in_memory_layout_loads_the_same(saved, tmp_path):
    """A raw `state_dict` dump (fused gate_up_proj [E,2F,D], down_proj [E,D,F]) loads identically."""
    from safetensors.torch import save_file

    m, model, d = saved
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in sd)
    save_file(sd, str(tmp_path / "model.safetensors"))
    a = hf.load_hf_checkpoint(d, m)
    b = hf.load_hf_checkpoint(tmp_path / "model.safetensors", m)
    assert _trees_equal(a, b)


def test_export_roundtrip_and_transformers_reload(saved, tmp_path):
    m, model, d = saved
    params = hf.load_hf_checkpoint(d, m)
    out = tmp_path / "export"
    files = hf.export_hf_checkpoint(params, m, out, max_shard_bytes=100_000)  # forces sharding
    assert len(files) > 1 and (out / "model.safetensors.index.json").exists()
    assert _trees_equal(hf.load_hf_checkpoint(out, m), params)
    m2, p2 = hf.load_pretrained(out, base=m)
    assert m2.to_dict() == m.to_dict() and _trees_equal(p2, params)

    reloaded = transformers.DeepseekV3ForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    tokens = _tokens(m, seed=2)
    ref_logits, ref_idx = _hf_forward(reloaded, tokens)
    logits, idx = _horizon_forward(params, tokens, m)
    assert _rel_err(logits, ref_logits) < REL_TOL
    np.testing.assert_array_equal(np.sort(idx, -1), np.sort(ref_idx, -1))


def test_config_mapping_roundtrip_and_legacy_rope():
    m = _tiny("yarn_fullq")
    hc = hf.hf_config_from_model_config(m)
    assert hc["q_lora_rank"] is None and hc["first_k_dense_replace"] == 1 and hc["hidden_size"] == m.d_model
    assert hf.model_config_from_hf(hc, base=m).to_dict() == m.to_dict()
    # original DeepSeek-V3 / Kimi-K2 config.json form: rope_scaling{type} + top-level rope_theta
    legacy = {k: v for k, v in hc.items() if k != "rope_parameters"}
    rp = dict(hc["rope_parameters"])
    legacy["rope_theta"] = rp.pop("rope_theta")
    rp["type"] = rp.pop("rope_type")
    legacy.update(rope_scaling=rp, topk_method="noaux_tc", scoring_func="sigmoid", num_nextn_predict_layers=1)
    m3 = hf.model_config_from_hf(legacy, base=m)
    assert m3.mtp_depth == 1 and m3.rope_scaling.to_dict() == m.rope_scaling.to_dict()
    with pytest.raises(ValueError, match="scoring_func"):
        hf.model_config_from_hf({**legacy, "scoring_func": "softmax"}, base=m)
    # the transformers config class accepts the kwargs and derives the same attention scale / rope
    c = transformers.DeepseekV3Config(**hc)
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding, yarn_apply_mscale

    from horizon.model import rope
    emb = DeepseekV3RotaryEmbedding(c)
    t = rope.rope_tables(m)
    np.testing.assert_allclose(t.inv_freq, emb.inv_freq.numpy(), rtol=1e-6)
    assert math.isclose(t.attention_factor, emb.attention_scaling, rel_tol=1e-6)
    assert math.isclose(rope.softmax_scale(m), yarn_apply_mscale(c.rope_parameters, c.qk_head_dim ** -0.5),
                        rel_tol=1e-6)


def test_mtp_export_names_and_roundtrip(tmp_path):
    m = _tiny("qlora")
    m.mtp_depth = 1
    params = _random_params(m, 3)
    hf.export_hf_checkpoint(params, m, tmp_path)
    r = hf.CheckpointReader(tmp_path)
    L = m.num_layers
    for n in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight", "shared_head.head.weight",
              "embed_tokens.weight", "self_attn.q_a_proj.weight", "mlp.experts.7.down_proj.weight"):
        assert f"model.layers.{L}.{n}" in r
    np.testing.assert_array_equal(r.get(f"model.layers.{L}.eh_proj.weight"), np.asarray(params["mtp"]["proj"][0]).T)
    assert _trees_equal(hf.load_hf_checkpoint(tmp_path, m), params)
    # mtp_depth = 0 skips the MTP layer; strict still rejects unknown tensors
    m0 = _tiny("qlora")
    p0 = hf.load_hf_checkpoint(tmp_path, m0)
    assert "mtp" not in p0 and np.array_equal(p0["moe"]["attn"]["wq_a"], params["moe"]["attn"]["wq_a"])
    assert json.loads((tmp_path / "config.json").read_text())["num_nextn_predict_layers"] == 1


def test_bf16_export_and_missing_tensor_error(tmp_path):
    from safetensors import safe_open

    m = _tiny("qlora")
    params = _random_params(m, 4)
    hf.export_hf_checkpoint(params, m, tmp_path, dtype="bfloat16")
    with safe_open(str(tmp_path / "model.safetensors"), "np") as f:  # the reference reader agrees with ours
        w = f.get_tensor("model.layers.0.self_attn.kv_b_proj.weight")
        assert str(w.dtype) == "bfloat16"
        np.testing.assert_array_equal(w, np.asarray(params["dense"]["attn"]["wkv_b"][0].astype(jnp.bfloat16)).T)
        assert f.get_tensor("model.layers.1.mlp.gate.e_score_correction_bias").dtype == np.float32
    p = hf.load_hf_checkpoint(tmp_path, m)
    assert p["embed"].dtype == jnp.float32  # loaded into param_dtype
    # missing tensor: rewrite the file without one expert
    r = hf.CheckpointReader(tmp_path)
    keep = [n for n in r.keys() if n != "model.layers.2.mlp.experts.3.up_proj.weight"]
    bad = tmp_path / "bad"
    bad.mkdir()
    hf.write_safetensors(bad / "model.safetensors",
                                [(n, r.shape(n), r.raw(n).dtype, lambda n=n: r.raw(n)) for n in keep])
    with pytest.raises(KeyError, match="experts.3.up_proj"):
        hf.load_hf_checkpoint(bad, m)


def test_fp8_block_dequantization(tmp_path):
    """DeepSeek-V3 fp8 weights: w = q * scale_inv per 128x128 tile (partial edge tiles)."""
    import ml_dtypes

    rng = np.random.default_rng(0)
    w = rng.normal(size=(200, 300)).astype(np.float32)
    B = 128
    s = np.zeros((2, 3), np.float32)
    q = np.zeros_like(w)
    for i in range(2):
        for j in range(3):
            tile = w[i * B:(i + 1) * B, j * B:(j + 1) * B]
            s[i, j] = np.abs(tile).max() / 448.0
            q[i * B:(i + 1) * B, j * B:(j + 1) * B] = tile / s[i, j]
    q8 = q.astype(ml_dtypes.float8_e4m3fn)
    hf.write_safetensors(tmp_path / "model.safetensors", [
        ("x.weight", q8.shape, q8.dtype, lambda: q8), ("x.weight_scale_inv", s.shape, s.dtype, lambda: s)])
    got = hf.CheckpointReader(tmp_path).get("x.weight")
    expect = q8.astype(np.float32) * np.kron(s, np.ones((B, B), np.float32))[:200, :300]
    np.testing.assert_array_equal(got, expect)
    # e4m3 has a 3-bit mantissa: relative error per element <= 2^-4 (plus subnormal tiny values)
    assert np.max(np.abs(got - w) / (np.abs(w) + 1e-2 * np.abs(w).max())) < 2 ** -4


def test_dense_only_and_tied_model_roundtrip(tmp_path):
    """num_experts=0 exports with first_k_dense_replace=num_layers; tied embeddings write no lm_head."""
    m = _tiny("qlora")
    m.num_experts, m.tie_embeddings = 0, True
    params = _random_params(m, 5)
    assert "moe" not in params and "lm_head" not in params
    hf.export_hf_checkpoint(params, m, tmp_path)
    hc = json.loads((tmp_path / "config.json").read_text())
    assert hc["first_k_dense_replace"] == m.num_layers and hc["tie_word_embeddings"] is True
    assert "lm_head.weight" not in hf.CheckpointReader(tmp_path)
    m2, p2 = hf.load_pretrained(tmp_path, base=m)
    assert m2.num_experts == 0 and m2.tie_embeddings and _trees_equal(p2, params)


# ------------------------------------------------------------- transformers-saved checkpoints (docs/SPEC.md §1.5)
YARN_ORIG = 16  # original_max_position_embeddings of the checkpoint below
LONG_SEQ = 3 * YARN_ORIG  # positions well past the original context: YaRN's interpolation is exercised


def _user_hf_config():
    """A tiny DeepseekV3Config as a user writes it (not via `hf_config_from_model_config`): q LoRA,
    group-limited noaux_tc routing, a dense first layer, legacy YaRN `rope_scaling`, one declared MTP
    layer (transformers builds and saves none)."""
    return transformers.DeepseekV3Config(
        vocab_size=320, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
        n_group=4, topk_group=2, topk_method="noaux_tc", routed_scaling_factor=2.5, first_k_dense_replace=1,
        max_position_embeddings=4 * YARN_ORIG, num_nextn_predict_layers=1, rope_interleave=True,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": YARN_ORIG,
                      "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 32.0, "beta_slow": 1.0},
        initializer_range=0.1)  # spread router scores: no near-ties between frameworks


@pytest.fixture(scope="module")
def user_saved(tmp_path_factory):
    model = _hf_model_from_config(_user_hf_config())
    d = tmp_path_factory.mktemp("hf_user")
    model.save_pretrained(d)
    return model, d


def _no_mtp_in(d, num_layers: int) -> bool:
    return not any(n.startswith(f"model.layers.{num_layers}.") for n in hf.CheckpointReader(d).keys())


def test_transformers_checkpoint_loads_with_fresh_mtp_and_matches_logits(user_saved):
    model, d = user_saved
    hc = json.loads((d / "config.json").read_text())
    assert hc["num_nextn_predict_layers"] == 1 and _no_mtp_in(d, hc["num_hidden_layers"])  # declared, not saved
    with pytest.warns(UserWarning, match=r"initialised 1 MTP layer\(s\) fresh"):
        m, params = hf.load_pretrained(d)
    assert (m.mtp_depth, m.q_lora_rank, m.n_group, m.topk_group, m.first_k_dense) == (1, 32, 4, 2, 1)
    assert m.rope_scaling.type == "yarn" and m.rope_scaling.mscale_all_dim == 0.5
    spec = jax.eval_shape(lambda k: transformer.init(k, m), jax.random.PRNGKey(0))
    assert jax.tree.structure(params) == jax.tree.structure(spec)
    assert _trees_equal(params["mtp"], hf.fresh_mtp_params(m, 0))  # the repo's init, key PRNGKey(0)

    tokens = _tokens(m, seq=LONG_SEQ)
    ref_logits, ref_idx = _hf_forward(model, tokens)
    logits, idx = _horizon_forward(params, tokens, m)
    err = _rel_err(logits, ref_logits)
    print(f"max relative logit error vs transformers: {err:.2e}")
    assert err < REL_TOL
    np.testing.assert_array_equal(np.sort(idx, -1), np.sort(ref_idx, -1))
    # the comparison sees YaRN: the same weights without it are far off
    m_plain = ml_collections.ConfigDict(m.to_dict())
    m_plain.rope_scaling.type = "none"
    assert _rel_err(_horizon_forward(params, tokens, m_plain)[0], ref_logits) > 100 * REL_TOL


def test_sharded_transformers_checkpoint_and_mtp_seed(user_saved, tmp_path):
    model, d = user_saved
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").exists() and len(list(tmp_path.glob("*.safetensors"))) > 1
    with pytest.warns(UserWarning):
        _, a = hf.load_pretrained(d)
    with pytest.warns(UserWarning):
        _, b = hf.load_pretrained(tmp_path)
    assert _trees_equal(a, b)
    with pytest.warns(UserWarning, match="mtp_init_seed=1"):
        m, c = hf.load_pretrained(d, mtp_init_seed=1)
    assert _trees_equal({k: v for k, v in a.items() if k != "mtp"}, {k: v for k, v in c.items() if k != "mtp"})
    assert not np.array_equal(a["mtp"]["proj"], c["mtp"]["proj"])
    with pytest.raises(KeyError, match=r"no MTP tensors .*layers\.3\.enorm"):
        hf.load_pretrained(d, mtp_init_seed=None)


def _rewrite_without(src, dst, drop: str) -> None:
    """Copy checkpoint `src` (config.json + tensors) to `dst` without tensor `drop`."""
    r = hf.CheckpointReader(src)
    assert drop in r
    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    hf.write_safetensors(dst / "model.safetensors", [(n, r.shape(n), r.raw(n).dtype, lambda n=n: r.raw(n))
                                                            for n in r.keys() if n != drop])


def test_partial_mtp_and_missing_attention_tensor_are_errors(user_saved, tmp_path):
    # an exported checkpoint with its MTP layer, less one MTP tensor: corrupt, not "train MTP fresh"
    m = _tiny("qlora")
    m.mtp_depth = 1
    hf.export_hf_checkpoint(_random_params(m, 6), m, tmp_path / "full")
    drop = f"model.layers.{m.num_layers}.self_attn.kv_b_proj.weight"
    _rewrite_without(tmp_path / "full", tmp_path / "partial", drop)
    with pytest.raises(KeyError, match=r"corrupt checkpoint .*" + re.escape(drop)):
        hf.load_pretrained(tmp_path / "partial", base=m)
    # fresh MTP never hides a missing main-model tensor
    _, d = user_saved
    drop = "model.layers.1.self_attn.q_b_proj.weight"
    _rewrite_without(d, tmp_path / "no_attn", drop)
    with pytest.raises(KeyError, match=r"1 tensors missing .*" + re.escape(drop)):
        hf.load_pretrained(tmp_path / "no_attn")
