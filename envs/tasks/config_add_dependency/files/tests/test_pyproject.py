import pathlib
import re
import tomllib

DATA = tomllib.loads(pathlib.Path("pyproject.toml").read_text())


def _deps():
    return {re.sub(r"\s+", "", d) for d in DATA["project"]["dependencies"]}


def test_requests_added():
    assert "requests>=2.31" in _deps()


def test_click_kept():
    assert "click>=8.1" in _deps()
    assert len(_deps()) == 2


def test_rest_unchanged():
    assert DATA["project"]["name"] == "weather-cli"
    assert DATA["project"]["scripts"] == {"weather": "weather.cli:main"}
