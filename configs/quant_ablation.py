"""Quant ablation (docs/SPEC.md §3): tiny MoE pretraining in bf16 vs MXFP8 vs NVFP4 per-tensor / per-token
vs approximate division. `python experiments/quant_ablation.py --config=configs/quant_ablation.py`.

Each run overrides `model.moe_precision`, `model.quant_division` and `model.quant_approx_rcp_bits`
of the tiny config; everything else (data, seed, optimizer) is shared, so runs differ only in the
expert-GEMM recipe.
"""

import ml_collections

from horizon.utils.config import sibling_config


def get_config() -> ml_collections.ConfigDict:
    c = sibling_config(__file__, "tiny.py")
    c.data.seq_len = 64
    c.data.batch_size = 8
    c.train.steps = 80
    c.train.warmup_steps = 10
    c.train.eval_every = 40
    c.train.eval_batches = 4
    c.train.output_dir = "runs/quant_ablation"
    c.train.compilation_cache_dir = ""
    c.quant = ml_collections.ConfigDict()
    # name -> (moe_precision, quant_division, quant_approx_rcp_bits); 8 bits exaggerates the fast path
    c.quant.runs = (
        ("bf16", "bf16", "ieee", 22),
        ("mxfp8", "mxfp8", "ieee", 22),
        ("nvfp4_per_tensor", "nvfp4", "ieee", 22),
        ("nvfp4_per_token", "nvfp4_per_token_fwd_mxfp8_bwd", "ieee", 22),
        ("nvfp4_per_token_approx22", "nvfp4_per_token_fwd_mxfp8_bwd", "approx", 22),
        ("nvfp4_per_token_approx8", "nvfp4_per_token_fwd_mxfp8_bwd", "approx", 8),
    )
    c.quant.smooth = 10  # moving-average window for the plotted train loss
    return c
