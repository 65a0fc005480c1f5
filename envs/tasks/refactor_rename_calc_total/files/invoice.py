"""Render invoices as text."""
from billing import calc_tot


def render_invoice(customer, lines, tax_rate=0.0):
    total = calc_tot(lines, tax_rate)
    return f"Invoice for {customer}: {total:.2f}"
