"""Async vs sync RL on experiments/rl.py's task (`make run`'s config-edit family), docs/SPEC.md §4, §4.1.

configs/rl_tiny.py (model, agent, RL hyperparameters, task family, Docker sandboxes) + the
`async_` section of configs/rl_async.py with `env="experiment"`.
Both loops of experiments/rl_async.py start from the SFT checkpoint experiments/rl.py wrote
(`async_.init_from`; the driver runs that SFT first if it is missing) and see the same RL
prompts (train seeds after the SFT ones) in the same batching: a worker generates one step's
`prompts_per_step` groups in one batch, like rl.py. `exp.steps` is the step count of every loop;
`rl.slots_per_batch = 0` and `async_.queue_depth = 0` mean `rl.prompts_per_step` (computed at use).

    python experiments/rl_async.py --config=configs/rl_async_tiny.py
"""

import ml_collections

from horizon.utils.config import sibling_config


def get_config() -> ml_collections.ConfigDict:
    c = sibling_config(__file__, "rl_tiny.py")
    c.async_ = sibling_config(__file__, "rl_async.py").async_
    a = c.async_
    a.env = "experiment"
    a.init_from = "runs/rl_tiny/sft"        # experiments/rl.py's SFT warm start (made if missing)
    a.run_dir = "runs/rl_async_tiny"
    a.max_staleness = 1                     # generate step t+1 while the trainer trains step t
    a.num_rollout_workers = 1
    c.rl.slots_per_batch = 0                # 0 = rl.prompts_per_step: one step's groups per generation (as rl.py)
    a.queue_depth = 0                       # 0 = rl.prompts_per_step
    a.threads_per_process = 1
    c.rl.checkpoint_every = 1               # the async trainer checkpoints every step
    return c
