"""Areas and perimeters."""

import math


def circle_area(r):
    """Area of a circle of radius r."""
    return math.pi * r * r


def rect_area(w, h):
    """Area of a w by h rectangle."""
    return w * h


def rect_perimeter(w, h):
    """Perimeter of a w by h rectangle."""
    return 2 * (w + h)
