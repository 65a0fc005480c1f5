import billing
from invoice import render_invoice


def test_calculate_total():
    assert billing.calculate_total([(2, 1.5), (1, 4.0)]) == 7.0
    assert billing.calculate_total([(1, 10.0)], tax_rate=0.1) == 11.0


def test_old_name_gone():
    assert not hasattr(billing, "calc_tot")


def test_render():
    assert render_invoice("ann", [(3, 1.0)]) == "Invoice for ann: 3.00"
