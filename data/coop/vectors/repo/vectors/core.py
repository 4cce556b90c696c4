"""Vectors as tuples of numbers."""


def add(u, v):
    """Element-wise sum."""
    return tuple(a + b for a, b in zip(u, v))


def dot(u, v):
    """Dot product."""
    return sum(a * b for a, b in zip(u, v))


def scale(u, k):
    """Every element times k."""
    return tuple(a * k for a in u)
