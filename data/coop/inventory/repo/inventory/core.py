"""Stock kept as a dict of item name -> quantity."""


def add_item(stock, name, qty):
    """A new stock with qty more of name."""
    out = dict(stock)
    out[name] = out.get(name, 0) + qty
    return out


def remove_item(stock, name, qty):
    """A new stock with qty fewer of name; ValueError when there are not enough."""
    if stock.get(name, 0) < qty:
        raise ValueError(f"not enough {name}")
    out = dict(stock)
    out[name] -= qty
    return out


def total_items(stock):
    """All quantities added up."""
    return sum(stock.values())
