"""Report figures 4 and 6 (docs/SPEC.md §4): experiments/kl_estimators.py and
experiments/length_penalty_curves.py read their sections of this config.

    python experiments/kl_estimators.py --config=configs/figures.py
    python experiments/length_penalty_curves.py --config=configs/figures.py --config.length_penalty.k_fixed=0.02
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.output_dir = "runs/figures"
    # Figure 4: k1/k2/k3 on q = N(0, 1), p = N(gap, 1)
    c.kl = ml_collections.ConfigDict(dict(
        num_samples=1_000_000,        # Monte-Carlo samples per gap
        gaps=(0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0),   # mean differences
    ))
    # Figure 6: f(x; k, q), horizon.env.rewards.penalty_curve
    c.length_penalty = ml_collections.ConfigDict(dict(
        x_max=200.0,                  # effort axis range (e.g. tool-call equivalents)
        k_fixed=0.05, qs=(0.0, 0.25, 0.5, 0.75, 1.0, 1.5),   # left and right panels: several q at fixed k
        q_fixed=0.5, ks=(0.005, 0.02, 0.05, 0.2, 1.0),       # middle panel: several k at fixed q
    ))
    return c
