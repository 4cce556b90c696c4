def transfer(source, target, amount):
    """(source - amount, target + amount); ValueError if it cannot go through."""
    if not can_afford(source, amount):
        raise ValueError("transfer not possible")
    return source - amount, target + amount
