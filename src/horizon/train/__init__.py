"""horizon.train."""
