def subtract(u, v):
    """Element-wise u - v; ValueError for different lengths."""
    if len(u) != len(v):
        raise ValueError("lengths differ")
    return tuple(a - b for a, b in zip(u, v))
