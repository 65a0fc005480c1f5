"""Low precision in RL (docs/SPEC.md §3, §4): make run's RL for 100 steps with the MoE expert GEMMs of the
trainer AND the rollout sampler in bf16, NVFP4 per-token forward + MXFP8 backward (the report's recipe,
IEEE and approximate scale division, the latter also with an exaggerated 8-bit reciprocal) and NVFP4
per-tensor (emulated formats, `horizon.quant.qmoe`); every arm from one bf16 SFT checkpoint
(`exp.sft.init_from`, made by the first run if missing).

    python experiments/sweep.py --sweep=configs/sweeps/low_precision_rl.py

The sampler and the trainer share the arm's precision, so the log-prob gap `sampler_logprob_diff` is what
the format itself makes of the two passes' different batches (per-tensor scales see the whole batch, per-token
scales one token). Each arm's ledger rows carry its grad norm, KL to the reference and the step at which it
diverged, if it did (`horizon.studies.arms.diverged_at`); docs/RESULTS.md "low_precision_rl".
"""

SCRIPT = "experiments/rl.py"
CONFIG = "configs/rl_tiny.py"
OUT_FIELD = "exp.out_dir"
SFT = "runs/rl_tiny_sft/sft"
STEPS = 100
BASE_OVERRIDES = {"exp.sft.init_from": SFT, "exp.steps": STEPS, "seed": 0,
                  "exp.ledger": "docs/results/low_precision_rl.jsonl"}
PLOT = ("step", "grad_norm")
# arm -> (model.moe_precision, model.quant_division, model.quant_approx_rcp_bits: the modelled fast reciprocal's
# mantissa bits, horizon.quant.formats; 22 is rcp.approx-like, 8 exaggerates its error as configs/quant_ablation.py
# does); bf16 first: the others are compared with it
ARMS = {"bf16": ("bf16", "ieee", 22),
        "nvfp4 per-token fwd + mxfp8 bwd": ("nvfp4_per_token_fwd_mxfp8_bwd", "ieee", 22),
        "nvfp4 per-token fwd + mxfp8 bwd, approx division": ("nvfp4_per_token_fwd_mxfp8_bwd", "approx", 22),
        "nvfp4 per-tensor": ("nvfp4", "ieee", 22),
        "nvfp4 per-token fwd + mxfp8 bwd, approx division (8-bit reciprocal)":
            ("nvfp4_per_token_fwd_mxfp8_bwd", "approx", 8)}


def get_sweep() -> list[dict]:
    return [{"model.moe_precision": p, "model.quant_division": d, "model.quant_approx_rcp_bits": bits,
             "exp.arm": f"moe precision: {name}"} for name, (p, d, bits) in ARMS.items()]
