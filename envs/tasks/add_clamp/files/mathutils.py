"""Numeric helpers."""


def lerp(a, b, t):
    """Linear interpolation between a and b."""
    return a + (b - a) * t
