"""horizon.env: the environment layer above the agent loop (docs/SPEC.md §4, §5, §6): task families
(`families`), their SFT demonstrations and demonstrator policies (`demos`), the pooled sandboxes
and batched rollouts with verification (`rollouts`) and the rewards (`rewards`). `horizon.tasks`
below it is data and rules (task sets, importers, verifiers)."""
