def curve(scores, target):
    """Shift all scores so the mean is target, capped at 100."""
    shift = target - average(scores)
    return [min(100, s + shift) for s in scores]
