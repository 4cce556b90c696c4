"""Counting words and sentences."""

import re


def word_count(text):
    """Number of whitespace-separated words."""
    return len(text.split())


def sentence_count(text):
    """Number of sentences ending in '.', '!' or '?'."""
    return len(re.findall(r"[.!?]+", text))


def average_word_length(text):
    """Mean length of the words, 0.0 for no words."""
    words = text.split()
    return sum(len(w) for w in words) / len(words) if words else 0.0
