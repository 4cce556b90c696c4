def parse_money(text):
    """'$1,234.50' -> 123450 cents."""
    clean = text.strip().lstrip("$").replace(",", "")
    dollars, _, cents = clean.partition(".")
    return int(dollars or 0) * 100 + int((cents + "00")[:2])
