import pytest
from units import c_to_f, f_to_c, km_to_miles


def test_c_to_f():
    assert c_to_f(100) == 212
    assert c_to_f(0) == 32
    assert c_to_f(-40) == -40


def test_round_trip():
    for c in (-10, 0, 37, 100):
        assert f_to_c(c_to_f(c)) == pytest.approx(c)


def test_km():
    assert km_to_miles(10) == pytest.approx(6.21371)
