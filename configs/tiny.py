"""Tiny MLA/MoE config: runs in seconds on CPU. Every hyperparameter lives here (docs/SPEC.md §1, §8).

Field names follow DeepSeek-V3's Hugging Face config where one exists (see
`horizon.model.hf` for the mapping).
"""

import ml_collections

from horizon.utils.tracking import tracking_fields


def model_config() -> ml_collections.ConfigDict:
    m = ml_collections.ConfigDict()
    m.vocab_size = 320            # ByteTokenizer: 256 bytes + specials
    m.tokenizer = "byte"          # "byte" | a tokenizer.json (or a directory holding one): horizon.data.tokenizer
    m.init_from = ""              # an HF checkpoint dir: architecture (+ tokenizer.json) and weights from it
    #                               (horizon.model.hf.apply_init_from / pretrained_params)
    m.init_checkpoint = ""        # or a horizon run's checkpoint dir (e.g. runs/pretrain_rl/seed0/checkpoints): the
    m.init_step = -1              # params of its step init_step (-1 = the newest; train.save_steps keeps budgets)
    m.d_model = 64                # HF hidden_size
    m.num_layers = 3              # HF num_hidden_layers
    m.first_k_dense = 1           # HF first_k_dense_replace
    m.num_heads = 4               # HF num_attention_heads
    m.q_lora_rank = 32            # 0 = full-rank q projection (HF q_lora_rank=None)
    m.kv_lora_rank = 32
    m.qk_nope_head_dim = 16
    m.qk_rope_head_dim = 8
    m.v_head_dim = 16
    m.mlp_dim = 128               # dense SwiGLU width (HF intermediate_size)
    m.moe_mlp_dim = 32            # per-expert width (HF moe_intermediate_size)
    m.num_experts = 8             # HF n_routed_experts
    m.num_shared_experts = 1      # HF n_shared_experts
    m.num_experts_per_tok = 2     # top-k
    m.n_group = 2                 # group-limited routing: groups of experts
    m.topk_group = 1              # groups kept per token (n_group == topk_group disables it)
    m.norm_topk_prob = True
    m.routed_scaling_factor = 2.5
    m.router_bias_update_rate = 1e-3  # aux-loss-free balancing step (DeepSeek-V3 gamma)
    m.replay_plausibility_ratio = 0.0  # 0 disables the router-replay plausibility filter
    m.replay_plausibility_score = "gate"  # the filter's score: "gate" (affinity) | "selection" (bias-adjusted)
    m.router_logit_noise = 0.0    # std of the router-logit noise (a sampler's, via rl.sampler.router_noise; moe.py)
    m.rms_norm_eps = 1e-6
    m.rope_theta = 10000.0
    m.max_seq_len = 512           # HF max_position_embeddings
    m.rope_scaling = ml_collections.ConfigDict(
        dict(type="none", factor=1.0, original_max_position_embeddings=512,
             beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=0.0))
    m.mtp_depth = 0               # number of MTP modules (0 = none)
    m.tie_embeddings = False
    m.attention_kernel = "blockwise"  # "blockwise" (memory linear in the sequence) | "dense" (the test reference)
    m.attention_block_q = 256     # query rows per attention block (horizon.model.blockwise)
    m.attention_block_kv = 256    # keys per attention block
    m.init_std = 0.02
    m.remat = False               # recompute each layer's activations in the backward pass (memory for compute)
    m.head_chunk = 4096           # training losses: a step of more tokens runs the LM head over chunks of this
    #                               many (horizon.model.head), never [tokens, vocab] logits at once; up to it, one
    #                               direct pass (short contexts keep their speed); 0 = always full logits
    m.dtype = "float32"           # compute dtype
    m.param_dtype = "float32"
    m.moe_precision = "bf16"      # "bf16" | "mxfp8" | "nvfp4" | "nvfp4_per_token_fwd_mxfp8_bwd" (docs/SPEC.md §3)
    m.grouped_impl = "auto"       # bf16 expert GEMM: "auto" (per backend, grouped.choose_impl) | "block" | "ragged_dot"
    m.quant_division = "ieee"     # NVFP4 scale division: "ieee" | "approx" (fast reciprocal model, docs/SPEC.md §3)
    m.quant_approx_rcp_bits = 22  # mantissa bits of the modelled fast reciprocal (horizon.quant.formats)
    return m


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.model = model_config()

    c.data = ml_collections.ConfigDict()
    c.data.root = ""              # corpus root for `sources` ("" = the repo root)
    c.data.sources = ("src", "experiments", "configs", "tests")  # the repo's own code (tuples: CLI-overridable)
    c.data.extensions = (".py", ".md", ".cfg", ".toml", ".sh")
    c.data.heldout_fraction = 0.1  # files (by hash) held out for eval loss
    c.data.seq_len = 128
    c.data.batch_size = 8
    c.data.shuffle_seed = 0
    c.data.worker_count = 0
    # Synthetic passkey documents in the training split (horizon.data.passkey, docs/SPEC.md §8): this fraction of the
    # training documents, each `passkey_len` tokens (0 = data.seq_len) with a key of `passkey_digits` digits; loss on
    # "all" their tokens or only on the "answer" (the key read back at the end), whose targets weigh `answer_weight`
    c.data.passkey_fraction = 0.0
    c.data.passkey_len = 0
    c.data.passkey_digits = 5
    c.data.passkey_loss = "all"
    c.data.passkey_answer_weight = 1.0

    c.train = ml_collections.ConfigDict()
    c.train.steps = 300
    c.train.lr = 3e-3
    c.train.warmup_steps = 20
    c.train.min_lr_ratio = 0.1
    c.train.weight_decay = 0.01
    c.train.b1 = 0.9
    c.train.b2 = 0.95
    c.train.eps = 1e-8
    c.train.grad_clip = 1.0
    c.train.mtp_loss_weight = 0.1
    c.train.mtp_freeze_trunk = False
    c.train.log_every = 10
    c.train.eval_every = 50
    c.train.eval_batches = 4
    c.train.checkpoint_every = 100
    c.train.max_checkpoints = 2
    c.train.save_steps = ()       # steps also checkpointed and evaluated, kept for later runs (0 = the init; they
    #                               must fit in max_checkpoints): e.g. pretraining budgets, model.init_checkpoint
    c.train.output_dir = "runs/pretrain_tiny"
    c.train.compilation_cache_dir = "runs/jax_cache"  # persistent XLA cache ("" = off); speeds restarts

    # Tracking (horizon.utils.tracking): TensorBoard event files in train.output_dir, W&B if exp.wandb.project
    c.exp = ml_collections.ConfigDict(tracking_fields())

    # Parallelism (docs/SPEC.md §2; horizon.parallel.mesh): mesh axis sizes, or a preset that overrides them.
    c.mesh = ml_collections.ConfigDict()
    c.mesh.presets = ("dp8", "fsdp4xcp2", "ep4xcp2", "ep8")  # the 8-device presets (mesh.PRESETS)
    c.mesh.preset = ""            # "" = use the sizes below; else one of horizon.parallel.mesh.PRESETS
    c.mesh.data = 1
    c.mesh.fsdp = 1
    c.mesh.expert = 1
    c.mesh.context = 1
    # EP slots per destination: 0 = drop-less (worst case), f > 0 = f*T*k/EP, drops counted
    c.mesh.capacity_factor = 0.0
    c.mesh.ep_dispatch = "padded"  # "padded" all_to_all (CPU+GPU) | "ragged" ragged_all_to_all (GPU only)
    c.mesh.ep_payload = "compute"  # "compute" dtype | "mxfp8" quantized dispatch (combine stays in compute dtype)
    c.mesh.ep_microbatches = 1    # token chunks pipelined through dispatch/GEMM/combine
    # Global sequence packing before each RL step (docs/SPEC.md §2; horizon.rl.runtime.core.pack_rows): rows are
    # assigned to the data-parallel ranks by an attention-aware cost c(n) = a*n + b*n^2 per row
    c.mesh.packing = "lpt"        # "lpt" (balanced, horizon.parallel.packing) | "none" (build_batch's order)
    c.mesh.packing_cost_a = 0.0   # a, b >= 0; both 0 = the model's analytic FLOPs (packing.model_cost_model)
    c.mesh.packing_cost_b = 0.0
    return c
