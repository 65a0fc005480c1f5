import pytest
from inventory import Inventory


def test_add_and_count():
    inv = Inventory()
    inv.add("a", 2)
    inv.add("a", 3)
    assert inv.count("a") == 5


def test_remove_too_many():
    inv = Inventory()
    inv.add("a", 1)
    with pytest.raises(ValueError):
        inv.remove("a", 2)


def test_sold_out_not_listed():
    inv = Inventory()
    inv.add("b", 1)
    inv.add("a", 2)
    inv.remove("b", 1)
    assert inv.skus() == ["a"]
    assert inv.count("b") == 0
