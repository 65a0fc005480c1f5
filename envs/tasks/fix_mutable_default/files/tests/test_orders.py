from orders import add_item, new_order, total_quantity


def test_orders_are_independent():
    first = new_order("ann")
    add_item(first, "apple", 2)
    second = new_order("bob")
    assert second["items"] == []
    assert total_quantity(first) == 2


def test_initial_items_not_mutated():
    initial = [("pear", 1)]
    order = new_order("cy", initial)
    add_item(order, "fig")
    assert initial == [("pear", 1)]
    assert total_quantity(order) == 2
