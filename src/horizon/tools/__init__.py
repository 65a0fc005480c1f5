"""horizon.tools."""
