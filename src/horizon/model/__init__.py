"""horizon.model."""
