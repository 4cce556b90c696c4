"""Describing shapes."""


def describe(name, area):
    """'circle: 3.14'."""
    return f"{name}: {area:.2f}"
