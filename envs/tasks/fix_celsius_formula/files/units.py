"""Unit conversions."""


def c_to_f(c):
    return c * 5 / 9 + 32


def f_to_c(f):
    return (f - 32) * 5 / 9


def km_to_miles(km):
    return km * 0.621371
