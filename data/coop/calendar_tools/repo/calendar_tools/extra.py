"""Reading dates."""


def parse_iso(text):
    """'2024-03-01' -> (2024, 3, 1)."""
    y, m, d = text.split("-")
    return int(y), int(m), int(d)
