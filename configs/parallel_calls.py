"""Parallel tool calls under a turn cost (docs/SPEC.md §5, §4.2): configs/rl_keyrecall.py (read key.txt and 3 logs,
a self-summary past the trigger, answer the key) where a turn may hold two reads (`agent.max_parallel_calls`) and
the reward charges every turn (`rl.length_penalty`: linear, turns only). The SFT demonstrator reads the next two
logs in one turn at rate `exp.sft.parallel_prob` (`horizon.env.demos.KeyRecallDemoPolicy`); RL then shows whether
the turn cost moves the parallel-call rate from where SFT left it. configs/sweeps/parallel_calls.py runs p = 0 and
0.1, each from its own SFT checkpoint.

    python experiments/rl.py --config=configs/parallel_calls.py --config.exp.sft.parallel_prob=0.1
"""

import ml_collections

from horizon.utils.config import sibling_config


def get_config() -> ml_collections.ConfigDict:
    c = sibling_config(__file__, "rl_keyrecall.py")
    c.exp.sft.parallel_prob = 0.0     # share of the demonstrator's read turns that read two logs at once
    c.exp.out_dir = "runs/parallel_calls"
    c.agent.max_parallel_calls = 2
    c.agent.max_new_tokens = 96       # two reads in one turn (48, one read's budget, cut the second call)
    lp = c.rl.length_penalty          # a turn cost: linear (q = 0), turns only, 0.05 of reward per turn
    lp.update(dict(enabled=True, q=0.0, scale=0.05))
    lp.weights.update(dict(thinking=0.0, tool_call=0.0, tool_output=0.0, final=0.0, tool_calls=0.0, turns=1.0))
    return c
