"""Statements."""


def statement(transactions):
    """One signed amount per line."""
    return "\n".join(f"{t:+.2f}" for t in transactions)
