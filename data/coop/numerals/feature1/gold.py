def is_roman(text):
    """Whether text is the canonical numeral of some 1-3999."""
    if not text or set(text) - set("IVXLCDM"):
        return False
    value = from_roman(text)
    return 1 <= value <= 3999 and to_roman(value) == text
