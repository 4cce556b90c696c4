"""Money as text."""


def format_money(cents):
    """1234 -> '$12.34'."""
    return f"${cents // 100}.{cents % 100:02d}"
