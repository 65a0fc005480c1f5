"""Pretraining -> RL (docs/SPEC.md §7; docs/RESULTS.md "pretrain_rl"): make run's SFT + RL (configs/rl_tiny.py, the
config-edit family in Docker) started from each pretraining budget of configs/pretrain_rl.py (`train.save_steps`,
0 = the init), one arm per budget, each with its own SFT (the start differs, so no SFT is shared).

    python experiments/pretrain.py --config=configs/pretrain_rl.py            # the budgets, seed 0 (minutes)
    python experiments/sweep.py --sweep=configs/sweeps/pretrain_rl.py        # SFT + RL from each budget
    # seed 1: its own pretraining run, then the same sweep from it
    python experiments/pretrain.py --config=configs/pretrain_rl.py --config.seed=1 \\
        --config.train.output_dir=runs/pretrain_rl/seed1
    python experiments/sweep.py --sweep=configs/sweeps/pretrain_rl.py --config.seed=1 \\
        --config.model.init_checkpoint=runs/pretrain_rl/seed1/checkpoints

Each run's ledger rows carry the budget's held-out pretraining loss (`horizon.studies.arms.init_record`), and the
section fits each run's outcome against it (`horizon.studies.fit`).
"""

import pathlib

from horizon.utils.config import load_config_file

SCRIPT = "experiments/rl.py"
CONFIG = "configs/rl_tiny.py"
OUT_FIELD = "exp.out_dir"
BUDGETS = tuple(load_config_file(pathlib.Path(__file__).parents[1] / "pretrain_rl.py").train.save_steps)
BASE_OVERRIDES = {"model.init_checkpoint": "runs/pretrain_rl/seed0/checkpoints", "seed": 0,
                  "exp.ledger": "docs/results/pretrain_rl.jsonl"}
PLOT = ("step", "reward_mean")


def get_sweep() -> list[dict]:
    return [{"model.init_step": b, "exp.arm": f"pretraining budget: {b} steps"} for b in BUDGETS]
