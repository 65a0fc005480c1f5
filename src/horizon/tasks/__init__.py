"""horizon.tasks."""
