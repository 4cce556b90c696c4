def convert_temperature(value, source, target):
    """Between 'C', 'F' and 'K'; ValueError for other units."""
    to_c = {"C": lambda v: v, "F": lambda v: (v - 32) * 5 / 9, "K": lambda v: v - 273.15}
    from_c = {"C": lambda v: v, "F": lambda v: v * 9 / 5 + 32, "K": lambda v: v + 273.15}
    if source not in to_c or target not in from_c:
        raise ValueError("unknown unit")
    return from_c[target](to_c[source](value))
