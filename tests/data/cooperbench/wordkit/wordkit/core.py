"""Text helpers."""


def word_count(text):
    """Number of whitespace-separated words."""
    return len(text.split())


def normalize_spaces(text):
    """Runs of whitespace become one space; no leading or trailing space."""
    return " ".join(text.split())


def first_word(text):
    """The first word, or an empty string."""
    words = text.split()
    return words[0] if words else ""
