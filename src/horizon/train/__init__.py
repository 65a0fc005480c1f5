"""horizon.train: LM train step, AdamW optimizer, orbax checkpoints (docs/SPEC.md §8)."""
