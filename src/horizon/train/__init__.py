"""horizon.train: LM train step, AdamW optimizer, orbax checkpoints (SPEC §8)."""
