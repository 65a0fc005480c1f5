"""Pretraining -> RL (docs/RESULTS.md "pretrain_rl"): the pretraining run whose budgets make run's SFT + RL starts from.

    python experiments/pretrain.py --config=configs/pretrain_rl.py                       # seed 0
    python experiments/pretrain.py --config=configs/pretrain_rl.py --config.seed=1 \\
        --config.train.output_dir=runs/pretrain_rl/seed1
    python experiments/sweep.py --sweep=configs/sweeps/pretrain_rl.py                     # SFT + RL per budget

configs/tiny.py's model (make run's: the byte tokenizer, the same param tree as configs/rl_tiny.py) trained on the
repository's own code. `train.save_steps` are the budgets: each is checkpointed and evaluated on the held-out
files, and the checkpoint keeps that loss, so an RL run started from it (`model.init_checkpoint`,
`model.init_step`) writes it into its ledger rows (`horizon.studies.arms.init_record`). The budgets are points
of one run (one schedule: a budget's checkpoint is the run at that step, not a run annealed to it).
"""

from horizon.utils.config import sibling_config

BUDGETS = (0, 150, 600, 2400)


def get_config():
    c = sibling_config(__file__, "tiny.py")
    c.model.max_seq_len = 256               # configs/rl_tiny.py's (RoPE has no parameters: the trees match)
    c.train.steps = BUDGETS[-1]
    c.train.save_steps = BUDGETS
    c.train.checkpoint_every = BUDGETS[-1]  # only the budgets (and the last step, one of them) are saved
    c.train.max_checkpoints = len(BUDGETS)
    c.train.eval_every = 150
    c.train.eval_batches = 16               # 16 x 8 x 128 held-out tokens per eval (the budgets' losses)
    c.train.log_every = 50
    c.train.output_dir = "runs/pretrain_rl/seed0"
    return c
