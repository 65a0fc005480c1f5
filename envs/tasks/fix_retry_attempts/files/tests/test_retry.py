import pytest
from retry import retry


def flaky(failures):
    calls = []

    def func():
        calls.append(1)
        if len(calls) <= failures:
            raise ValueError(f"fail {len(calls)}")
        return "ok"

    return func, calls


def test_succeeds_on_last_retry():
    func, calls = flaky(3)
    assert retry(func, retries=3) == "ok"
    assert len(calls) == 4


def test_zero_retries_reraises():
    func, calls = flaky(5)
    with pytest.raises(ValueError, match="fail 1"):
        retry(func, retries=0)
    assert len(calls) == 1


def test_gives_up():
    func, calls = flaky(10)
    with pytest.raises(ValueError, match="fail 3"):
        retry(func, retries=2)
