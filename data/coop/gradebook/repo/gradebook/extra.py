"""Distributions."""


def histogram(scores):
    """Letter -> count."""
    from gradebook.core import letter

    out = {}
    for s in scores:
        out[letter(s)] = out.get(letter(s), 0) + 1
    return out
