def largest(shapes):
    """Name of the largest area, first on ties; None if empty."""
    best = None
    for name, area in shapes:
        if best is None or area > best[1]:
            best = (name, area)
    return best[0] if best else None
