"""horizon.parallel."""
