"""Warehouse stock levels."""


class Inventory:
    def __init__(self):
        self._stock = {}

    def add(self, sku, qty):
        if qty <= 0:
            raise ValueError("qty must be positive")
        self._stock[sku] = self._stock.get(sku, 0) + qty

    def remove(self, sku, qty):
        have = self._stock.get(sku, 0)
        if qty > have:
            raise ValueError(f"only {have} of {sku} left")
        self._stock[sku] = have - qty

    def count(self, sku):
        return self._stock.get(sku, 0)

    def skus(self):
        """SKUs currently in stock, sorted."""
        return sorted(self._stock)
