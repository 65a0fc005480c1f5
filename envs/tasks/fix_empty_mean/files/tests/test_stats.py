from stats import mean, summary


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_empty_summary():
    assert summary([]) == {"n": 0, "mean": 0.0, "max": None}


def test_summary():
    assert summary([2, 8]) == {"n": 2, "mean": 5.0, "max": 8}
