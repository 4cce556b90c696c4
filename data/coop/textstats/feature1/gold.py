def char_frequency(text):
    """How often each letter occurs, case-insensitive."""
    counts = {}
    for ch in text.lower():
        if ch.isalpha():
            counts[ch] = counts.get(ch, 0) + 1
    return counts
