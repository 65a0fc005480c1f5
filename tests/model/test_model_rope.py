"""RoPE / YaRN parity with Hugging Face DeepseekV3 (the converter relies on this convention)."""

import math

import jax.numpy as jnp
import numpy as np
import pytest
from model_testlib import tiny_cfg

from horizon.model import rope

torch = pytest.importorskip("torch")
hf_rope = pytest.importorskip("transformers.modeling_rope_utils")
hf_ds = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3")
from transformers import DeepseekV3Config  # noqa: E402


def _cfgs():
    plain = tiny_cfg()
    yarn_ds = tiny_cfg()  # DeepSeek-V3-like: mscale == mscale_all_dim -> attention factor 1, scale * m^2
    yarn_ds.rope_scaling.update(dict(type="yarn", factor=40.0, original_max_position_embeddings=64,
                                     beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0))
    yarn_mix = tiny_cfg()  # attention factor != 1
    yarn_mix.rope_scaling.update(dict(type="yarn", factor=4.0, original_max_position_embeddings=16,
                                      beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=0.8))
    yarn_noall = tiny_cfg()  # mscale_all_dim == 0 -> attention factor = mscale(factor)
    yarn_noall.rope_scaling.update(dict(type="yarn", factor=8.0, original_max_position_embeddings=32,
                                        beta_fast=1.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=0.0))
    return [plain, yarn_ds, yarn_mix, yarn_noall]


def _hf_config(c):
    rp = {"rope_type": "default", "rope_theta": c.rope_theta}
    if c.rope_scaling.type == "yarn":
        rs = c.rope_scaling
        rp = dict(rope_type="yarn", rope_theta=c.rope_theta, factor=rs.factor,
                  original_max_position_embeddings=rs.original_max_position_embeddings,
                  beta_fast=rs.beta_fast, beta_slow=rs.beta_slow, mscale=rs.mscale, mscale_all_dim=rs.mscale_all_dim)
    return DeepseekV3Config(
        vocab_size=c.vocab_size, hidden_size=c.d_model, num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_heads, qk_nope_head_dim=c.qk_nope_head_dim, qk_rope_head_dim=c.qk_rope_head_dim,
        v_head_dim=c.v_head_dim, kv_lora_rank=c.kv_lora_rank, q_lora_rank=c.q_lora_rank or None,
        max_position_embeddings=c.max_seq_len, rope_parameters=rp, rope_interleave=True)


@pytest.mark.parametrize("idx", range(4))
def test_tables_and_scale_match_hf(idx):
    c = _cfgs()[idx]
    hc = _hf_config(c)
    emb = hf_ds.DeepseekV3RotaryEmbedding(hc)
    t = rope.rope_tables(c)
    # Same float32 formulas -> equal to float32 rounding (1e-6 relative).
    np.testing.assert_allclose(t.inv_freq, emb.inv_freq.numpy(), rtol=1e-6)
    assert math.isclose(t.attention_factor, float(emb.attention_scaling), rel_tol=1e-12)
    attn = hf_ds.DeepseekV3Attention(hc, layer_idx=0)
    assert math.isclose(rope.softmax_scale(c), float(attn.scaling), rel_tol=1e-12)
    if idx == 2:  # the mixed case really exercises both factors
        assert t.attention_factor != 1.0 and rope.softmax_scale(c) != (c.qk_nope_head_dim + c.qk_rope_head_dim) ** -0.5


def test_interleaved_rotation_gives_hf_scores():
    """q.k after our in-place interleaved rotation == after HF's apply_rotary_pos_emb_interleave."""
    c = _cfgs()[2]
    hc = _hf_config(c)
    emb = hf_ds.DeepseekV3RotaryEmbedding(hc)
    rng = np.random.default_rng(0)
    s, d = 7, c.qk_rope_head_dim
    q = rng.standard_normal((1, s, 2, d)).astype(np.float32)  # [b, s, h, d]
    k = rng.standard_normal((1, s, d)).astype(np.float32)
    pos = np.array([[0, 1, 2, 5, 9, 100, 300]])
    cos, sin = emb(torch.zeros(1), torch.tensor(pos))
    qh, kh = hf_ds.apply_rotary_pos_emb_interleave(
        torch.tensor(q).transpose(1, 2), torch.tensor(k)[:, None], cos, sin)
    ref = torch.einsum("bhtd,bhsd->bhts", qh, kh.expand(-1, 2, -1, -1)).numpy()
    t = rope.rope_tables(c)
    qj, kj = rope.apply_rope(jnp.asarray(q), jnp.asarray(pos), t), rope.apply_rope(jnp.asarray(k), jnp.asarray(pos), t)
    ours = np.asarray(jnp.einsum("bthd,bsd->bhts", qj, kj))
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)  # f32 sums of 8 products, |x| ~ 3


def test_bad_rope_type():
    c = tiny_cfg()
    c.rope_scaling.type = "linear"
    with pytest.raises(ValueError, match="rope_scaling.type"):
        rope.rope_tables(c)
