"""Lengths."""

import math


def norm(u):
    """Euclidean length."""
    return math.sqrt(sum(a * a for a in u))
