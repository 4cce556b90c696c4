"""Identifier case styles."""

import re


def snake_to_camel(name):
    """'my_var' -> 'myVar'."""
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


def camel_to_snake(name):
    """'myVar' -> 'my_var'."""
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def is_snake(name):
    """Lower-case words joined by underscores."""
    return re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)*", name) is not None
