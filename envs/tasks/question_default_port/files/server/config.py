"""Where settings come from: SHOP_PORT env var > settings.json > fallback."""
import json
import os
import pathlib

FALLBACK_PORT = 8443
SETTINGS = pathlib.Path(__file__).with_name("settings.json")


def resolve_port(env=None):
    env = os.environ if env is None else env
    if env.get("SHOP_PORT"):
        return int(env["SHOP_PORT"])
    settings = json.loads(SETTINGS.read_text())
    return int(settings.get("port") or FALLBACK_PORT)
