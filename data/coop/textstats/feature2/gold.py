def longest_word(text):
    """The longest word, the first on ties; '' for no words."""
    best = ""
    for w in text.split():
        if len(w) > len(best):
            best = w
    return best
