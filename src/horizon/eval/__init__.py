"""horizon.eval."""
