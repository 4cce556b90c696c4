"""Small text helpers."""

from wordkit.core import normalize_spaces, word_count

__all__ = ["normalize_spaces", "word_count"]
