"""horizon.sandbox."""
