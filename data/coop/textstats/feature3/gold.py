def reading_time(text, wpm=200):
    """Minutes to read the text, rounded up; 0 for no words."""
    words = len(text.split())
    return -(-words // wpm)
