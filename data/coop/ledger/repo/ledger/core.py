"""Balances of an account."""


def deposit(balance, amount):
    """Balance after a deposit; ValueError for a non-positive amount."""
    if amount <= 0:
        raise ValueError("amount must be positive")
    return balance + amount


def withdraw(balance, amount):
    """Balance after a withdrawal; ValueError when it would overdraw."""
    if amount > balance:
        raise ValueError("insufficient funds")
    return balance - amount


def can_afford(balance, amount):
    """Whether a withdrawal would go through."""
    return 0 < amount <= balance
