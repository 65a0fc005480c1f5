"""The real Kimi-K2 shape (1.04T total / 32B active; docs/SPEC.md §1). Shape-only on CPU (jax.eval_shape).

Values from the public Kimi-K2 config (DeepSeek-V3 architecture): 61 layers, first layer
dense, 384 routed experts top-8 + 1 shared, hidden 7168, MLA with 64 heads (DeepSeek-V3
itself uses 128), q_lora 1536, kv_lora 512, YaRN x32 from 4k to 128k.
"""

from horizon.utils.config import sibling_config


def get_config():
    c = sibling_config(__file__, "tiny.py")
    m = c.model
    m.vocab_size = 163840
    m.d_model = 7168
    m.num_layers = 61
    m.first_k_dense = 1
    m.num_heads = 64
    m.q_lora_rank = 1536
    m.kv_lora_rank = 512
    m.qk_nope_head_dim = 128
    m.qk_rope_head_dim = 64
    m.v_head_dim = 128
    m.mlp_dim = 18432
    m.moe_mlp_dim = 2048
    m.num_experts = 384
    m.num_shared_experts = 1
    m.num_experts_per_tok = 8
    m.n_group = 1
    m.topk_group = 1
    m.routed_scaling_factor = 2.827
    m.rope_theta = 50000.0
    m.max_seq_len = 131072
    m.rope_scaling.type = "yarn"
    m.rope_scaling.factor = 32.0
    m.rope_scaling.original_max_position_embeddings = 4096
    m.rope_scaling.beta_fast = 1.0
    m.rope_scaling.beta_slow = 1.0
    m.rope_scaling.mscale = 1.0
    m.rope_scaling.mscale_all_dim = 1.0
    m.mtp_depth = 0
    m.dtype = "bfloat16"
    m.param_dtype = "bfloat16"
    c.data.seq_len = 32768
    c.train.output_dir = "runs/kimi_k2"
    return c
