def triangle_area(a, b, c):
    """Heron's formula; ValueError for impossible sides."""
    if a + b <= c or a + c <= b or b + c <= a:
        raise ValueError("not a triangle")
    s = (a + b + c) / 2
    return math.sqrt(s * (s - a) * (s - b) * (s - c))
