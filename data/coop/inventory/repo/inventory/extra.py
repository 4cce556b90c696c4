"""Reports on a stock."""


def format_report(stock):
    """One 'name: qty' line per item, sorted by name."""
    return "\n".join(f"{k}: {v}" for k, v in sorted(stock.items()))
