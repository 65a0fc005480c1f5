"""Invoice arithmetic."""


def calc_tot(lines, tax_rate=0.0):
    """Sum of qty * unit price, plus tax, rounded to cents."""
    subtotal = sum(qty * price for qty, price in lines)
    return round(subtotal * (1 + tax_rate), 2)
