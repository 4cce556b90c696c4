"""Word rankings."""

from collections import Counter


def top_words(text, n=3):
    """The n most common lower-cased words."""
    return [w for w, _ in Counter(text.lower().split()).most_common(n)]
