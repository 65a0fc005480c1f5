import json

from appconfig import load_config


def test_defaults():
    assert load_config(env={}) == {"host": "127.0.0.1", "port": 8000, "debug": False}


def test_file(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"port": 9000}))
    assert load_config(p, env={})["port"] == 9000


def test_env_overrides_file(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"port": 9000, "host": "0.0.0.0"}))
    cfg = load_config(p, env={"APP_PORT": "9100", "APP_HOST": "example.org"})
    assert cfg["port"] == 9100
    assert cfg["host"] == "example.org"
    assert cfg["debug"] is False
