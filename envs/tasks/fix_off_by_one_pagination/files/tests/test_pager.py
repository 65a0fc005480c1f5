import pytest
from pager import page_count, paginate


def test_first_page():
    assert paginate(list(range(25)), 1) == list(range(10))


def test_last_page():
    assert paginate(list(range(25)), 3) == [20, 21, 22, 23, 24]


def test_custom_page_size():
    assert paginate(list("abcdefg"), 1, per_page=3) == ["a", "b", "c"]


def test_page_count():
    assert page_count(list(range(25))) == 3


def test_bad_page():
    with pytest.raises(ValueError):
        paginate([1], 0)
