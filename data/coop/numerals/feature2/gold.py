def roman_add(a, b):
    """Sum of two numerals as a numeral."""
    return to_roman(from_roman(a) + from_roman(b))
