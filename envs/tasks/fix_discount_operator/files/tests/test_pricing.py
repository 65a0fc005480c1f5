import pytest
from pricing import add_tax, apply_discount


def test_discount():
    assert apply_discount(100.0, 25) == 75.0
    assert apply_discount(19.99, 10) == 17.99


def test_zero_discount():
    assert apply_discount(50.0, 0) == 50.0


def test_bad_percent():
    with pytest.raises(ValueError):
        apply_discount(10.0, 150)


def test_tax_untouched():
    assert add_tax(100.0) == 120.0
