import json
import pathlib

CFG = json.loads(pathlib.Path("settings.json").read_text())


def test_cache_enabled():
    assert CFG["app"]["cache"]["enabled"] is True


def test_rest_unchanged():
    assert CFG["app"]["cache"]["ttl_seconds"] == 60
    assert CFG["app"]["name"] == "shop"
    assert CFG["features"] == ["search", "checkout"]
