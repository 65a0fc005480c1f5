"""Learning-rate sweep of the tiny pretraining run (experiments/sweep.py; ~1 min per run on 2 CPU cores).

    python experiments/sweep.py --sweep=configs/sweeps/lr_tiny.py
"""

SCRIPT = "experiments/pretrain.py"
CONFIG = "configs/tiny.py"
OUT_FIELD = "train.output_dir"     # each run's directory: --config.train.output_dir=<sweep out>/<run>
BASE_OVERRIDES = {"train.steps": 20, "train.eval_every": 10, "train.eval_batches": 1, "train.log_every": 5,
                  "train.warmup_steps": 2, "train.checkpoint_every": 20}
PLOT = ("step", "loss")


def get_sweep() -> list[dict]:
    return [{"train.lr": lr, "seed": 0} for lr in (3e-4, 1e-3, 3e-3)]
