def to_csv(stock):
    """CSV with a name,qty header, rows sorted by name."""
    lines = ["name,qty"] + [f"{k},{v}" for k, v in sorted(stock.items())]
    return "".join(line + "\n" for line in lines)
