"""Roman numerals."""

VALUES = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
          (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]


def to_roman(n):
    """1994 -> 'MCMXCIV' (1-3999)."""
    out = ""
    for value, symbol in VALUES:
        while n >= value:
            out += symbol
            n -= value
    return out


def from_roman(text):
    """'MCMXCIV' -> 1994."""
    digits = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
    total = 0
    for a, b in zip(text, text[1:] + " "):
        v = digits[a]
        total += -v if b != " " and digits[b] > v else v
    return total


def roman_length(n):
    """Number of symbols in n's numeral."""
    return len(to_roman(n))
