def circle_perimeter(r):
    """2 pi r; ValueError for a negative radius."""
    if r < 0:
        raise ValueError("negative radius")
    return 2 * math.pi * r
