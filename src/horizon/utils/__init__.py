"""horizon.utils."""
