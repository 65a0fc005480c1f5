import pytest
from duration import parse_duration
from scheduler import next_run


def test_simple_units():
    assert parse_duration("45s") == 45
    assert parse_duration("2m") == 120
    assert parse_duration("1d") == 86400


def test_hours():
    assert parse_duration("2h") == 7200
    assert parse_duration("1h30m") == 5400


def test_bad():
    with pytest.raises(ValueError):
        parse_duration("5x")


def test_scheduler():
    assert next_run("cleanup", 1000) == 4600
