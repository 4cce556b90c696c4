"""Unit conversions."""


def c_to_f(c):
    """Celsius to Fahrenheit."""
    return c * 9 / 5 + 32


def f_to_c(f):
    """Fahrenheit to Celsius."""
    return (f - 32) * 5 / 9


def km_to_miles(km):
    """Kilometres to miles."""
    return km / 1.609344
