"""horizon.rl."""
