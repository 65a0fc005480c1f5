from settings import DEFAULTS, effective_settings, merge


def test_override_wins():
    assert merge({"a": 1, "b": 2}, {"b": 3}) == {"a": 1, "b": 3}


def test_nested():
    got = effective_settings({"workers": 8, "log": {"level": "debug"}})
    assert got == {"debug": False, "workers": 8, "log": {"level": "debug", "file": None}}


def test_defaults_untouched():
    effective_settings({"debug": True})
    assert DEFAULTS["debug"] is False
