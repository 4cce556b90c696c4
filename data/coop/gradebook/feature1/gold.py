def median(scores):
    """Middle score, mean of the middle two for even counts; ValueError if none."""
    if not scores:
        raise ValueError("no scores")
    s = sorted(scores)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
