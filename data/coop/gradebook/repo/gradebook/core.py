"""Scores out of 100."""


def average(scores):
    """Mean score; ValueError for no scores."""
    if not scores:
        raise ValueError("no scores")
    return sum(scores) / len(scores)


def letter(score):
    """A (90+), B (80+), C (70+), D (60+) or F."""
    for cutoff, grade in ((90, "A"), (80, "B"), (70, "C"), (60, "D")):
        if score >= cutoff:
            return grade
    return "F"


def passed(score):
    """60 or more passes."""
    return score >= 60
