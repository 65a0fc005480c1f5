"""Order bookkeeping."""


def new_order(customer, items=[]):
    """Start an order for `customer`, optionally with initial items."""
    order = {"customer": customer, "items": items}
    return order


def add_item(order, sku, qty=1):
    if qty <= 0:
        raise ValueError("qty must be positive")
    order["items"].append((sku, qty))
    return order


def total_quantity(order):
    return sum(qty for _, qty in order["items"])
