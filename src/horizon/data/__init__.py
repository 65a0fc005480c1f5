"""horizon.data."""
