from versions import is_newer, latest, parse_version


def test_parse():
    assert parse_version("1.2.3") == (1, 2, 3)


def test_newer():
    assert is_newer("1.10.0", "1.9.9")
    assert not is_newer("1.2", "1.2")


def test_latest():
    assert latest(["0.9", "0.10", "0.2"]) == "0.10"
