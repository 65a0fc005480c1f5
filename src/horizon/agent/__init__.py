"""horizon.agent."""
