"""A DeepSeek-V2-Lite-like model that trains on one H200 with its AdamW state (docs/PERF.md "On a lent H200").

V2-Lite's shapes (d_model 2048, 16 heads, MLA kv rank 512 with full-rank q, 64 routed + 2 shared
experts of dim 1408, top-6, vocab 102400) with 8 layers instead of 27 and V3's sigmoid router
(this codebase's MoE). bf16 compute and parameters, seq 4096, batch 2. 4.59B parameters (4.6 of the
27-layer model's 15.7B): bf16 params, grads and AdamW moments (optax keeps them in the params' dtype)
are ~37 GB, well under the H200's 141 GB; one step is 5.1e13 FLOPs (`params.train_step_flops`).
`benchmarks/train_step.py --config configs/v2_lite.py` measures its step.
"""

from horizon.utils.config import sibling_config


def get_config():
    c = sibling_config(__file__, "tiny.py")
    m = c.model
    m.vocab_size = 102400
    m.d_model = 2048
    m.num_layers = 8
    m.first_k_dense = 1
    m.num_heads = 16
    m.q_lora_rank = 0
    m.kv_lora_rank = 512
    m.qk_nope_head_dim = 128
    m.qk_rope_head_dim = 64
    m.v_head_dim = 128
    m.mlp_dim = 10944
    m.moe_mlp_dim = 1408
    m.num_experts = 64
    m.num_shared_experts = 2
    m.num_experts_per_tok = 6
    m.n_group = 1
    m.topk_group = 1
    m.routed_scaling_factor = 1.0
    m.norm_topk_prob = False
    m.max_seq_len = 4096
    m.rope_scaling.original_max_position_embeddings = 4096
    m.dtype = "bfloat16"
    m.param_dtype = "bfloat16"
    c.data.seq_len = 4096
    c.data.batch_size = 2
    c.train.output_dir = "runs/pretrain_v2_lite"
    return c
