def truncate_words(text, n):
    """The first n words, '...' appended when some were cut."""
    words = text.split()
    return " ".join(words[:n]) + ("..." if len(words) > n else "")
