def summarize(transactions):
    """(total deposited, total withdrawn), both positive."""
    deposits = sum(t for t in transactions if t > 0)
    withdrawals = -sum(t for t in transactions if t < 0)
    return deposits, withdrawals
