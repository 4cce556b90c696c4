def normalize(u):
    """u scaled to length 1; ValueError for the zero vector."""
    n = norm(u)
    if n == 0:
        raise ValueError("zero vector")
    return tuple(a / n for a in u)
