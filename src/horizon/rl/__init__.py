"""horizon.rl: reinforcement learning on agent rollouts (docs/SPEC.md §4), in two layers.

- `horizon.rl.algo`: advantages, losses, KL, batch layout, the RL train step (pure);
- `horizon.rl.runtime`: the loops over them (sync, SFT, async), weight sync, stores, checks.

Sampling lives below, in `horizon.inference`; rewards in `horizon.env.rewards` (docs/ARCHITECTURE.md).
"""
