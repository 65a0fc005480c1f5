"""~100M-parameter MLA/MoE config (CPU benchmarks at reduced batch; GPU-friendly shapes)."""

from horizon.utils.config import sibling_config


def get_config():
    c = sibling_config(__file__, "tiny.py")
    m = c.model
    m.vocab_size = 32768
    m.d_model = 512
    m.num_layers = 8
    m.first_k_dense = 1
    m.num_heads = 8
    m.q_lora_rank = 256
    m.kv_lora_rank = 128
    m.qk_nope_head_dim = 64
    m.qk_rope_head_dim = 32
    m.v_head_dim = 64
    m.mlp_dim = 1536
    m.moe_mlp_dim = 256
    m.num_experts = 32
    m.num_shared_experts = 1
    m.num_experts_per_tok = 4
    m.n_group = 4
    m.topk_group = 2
    m.max_seq_len = 2048
    m.rope_scaling.original_max_position_embeddings = 2048
    c.data.seq_len = 512
    c.data.batch_size = 16
    c.train.lr = 1e-3
    c.train.output_dir = "runs/pretrain_small"
    return c
