"""Text for URLs."""

import re


def slugify(text):
    """'Hello, World' -> 'hello-world'."""
    return "-".join(re.findall(r"[a-z0-9]+", text.lower()))
