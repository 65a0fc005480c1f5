"""horizon.model: the model as pure functions over param pytrees, and HF checkpoints (docs/SPEC.md §1)."""
