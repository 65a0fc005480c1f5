"""horizon.utils: config, command line, files, seeds, shapes and timing; below every other layer."""
