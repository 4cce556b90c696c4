"""Reading quantities written as text."""


def parse_quantity(text):
    """'12 km' -> (12.0, 'km')."""
    number, unit = text.split()
    return float(number), unit
