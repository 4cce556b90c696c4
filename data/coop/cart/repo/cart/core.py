"""Prices of a shopping cart."""


def line_total(price, qty):
    """Price times quantity."""
    return price * qty


def subtotal(items):
    """Sum of line totals of (price, qty) pairs."""
    return sum(line_total(p, q) for p, q in items)


def item_count(items):
    """Number of units in the cart."""
    return sum(q for _, q in items)
