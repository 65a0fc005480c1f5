"""experiments/rl.py on the key-recall family (docs/SPEC.md §4-§6): several actions per episode (read key.txt, then
3 logs, a self-summary when the context passes the trigger, then the answer), the family and budgets of
configs/selfsum_tiny.py with one strategy, so one RL run is one arm of a study sweep (configs/sweeps/).

    python experiments/rl.py --config=configs/rl_keyrecall.py

SFT: the self-summarization study's two-stage warm start on `exp.strategies`' demonstrations
(`horizon.studies.selfsum.warm_start_demos`), made once into `exp.sft.init_from` where a sweep shares it.
"""

import ml_collections

from horizon.utils.config import sibling_config


def get_config() -> ml_collections.ConfigDict:
    c = sibling_config(__file__, "selfsum_tiny.py")
    e = c.exp
    e.strategies = ("self_summary",)  # the SFT mix (horizon.studies.selfsum.warm_start_demos): the run's strategy only
    e.steps = 30                      # RL steps (~25 s each alone on 2 cores, configs/selfsum_tiny.py)
    e.out_dir = "runs/rl_keyrecall"
    c.agent.context_strategy = "self_summary"
    return c
