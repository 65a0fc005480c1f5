from decimal import Decimal


def parse_amount(text):
    return Decimal(text.replace(",", "").strip())
