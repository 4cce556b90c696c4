def snake_to_pascal(name):
    """'my_var' -> 'MyVar'."""
    return "".join(p.capitalize() for p in name.split("_"))
