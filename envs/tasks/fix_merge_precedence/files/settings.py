"""Layered settings: defaults overridden by the user's file."""

DEFAULTS = {"debug": False, "workers": 4, "log": {"level": "info", "file": None}}


def merge(defaults, overrides):
    """Overrides win over defaults; nested dicts are merged key by key."""
    out = dict(overrides)
    for key, value in defaults.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(value, out[key])
        else:
            out[key] = value
    return out


def effective_settings(user):
    return merge(DEFAULTS, user)
