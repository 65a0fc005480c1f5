import pytest
import roman

CASES = [(1, "I"), (4, "IV"), (9, "IX"), (14, "XIV"), (40, "XL"), (90, "XC"),
         (400, "CD"), (1994, "MCMXCIV"), (2024, "MMXXIV"), (3999, "MMMCMXCIX")]


@pytest.mark.parametrize("n,text", CASES)
def test_from_roman(n, text):
    assert roman.from_roman(text) == n


@pytest.mark.parametrize("n,text", CASES)
def test_to_roman(n, text):
    assert roman.to_roman(n) == text


def test_round_trip():
    for n in range(1, 400):
        assert roman.from_roman(roman.to_roman(n)) == n


@pytest.mark.parametrize("bad", [0, 4000, -3])
def test_out_of_range(bad):
    with pytest.raises(ValueError):
        roman.to_roman(bad)
