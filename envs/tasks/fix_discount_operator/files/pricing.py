"""Price helpers for the checkout."""


def apply_discount(price, percent):
    """Price after a percentage discount, rounded to cents."""
    if not 0 <= percent <= 100:
        raise ValueError("percent must be between 0 and 100")
    return round(price * (1 + percent / 100), 2)


def add_tax(price, rate=0.2):
    return round(price * (1 + rate), 2)
