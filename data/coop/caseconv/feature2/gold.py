def kebab_to_snake(name):
    """'My-Var' -> 'my_var'."""
    return name.replace("-", "_").lower()
