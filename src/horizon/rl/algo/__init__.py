"""RL maths (docs/SPEC.md §4): pure functions of arrays and configs — advantages, losses and KL
estimators (`losses`), chains to padded rows (`batch`), and the RL step itself
(`trainer.train_step`: Dr.GRPO with router replay, KL k1)."""
