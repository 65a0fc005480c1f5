"""App configuration: defaults, then an optional JSON file."""
import json
import os

DEFAULTS = {"host": "127.0.0.1", "port": 8000, "debug": False}


def load_config(path=None, env=None):
    env = os.environ if env is None else env
    cfg = dict(DEFAULTS)
    if path:
        with open(path) as f:
            cfg.update(json.load(f))
    return cfg
