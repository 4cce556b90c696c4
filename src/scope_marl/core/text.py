"""Text that enters an episode must be serializable: this is where that is made true.

A string from a remote server can hold lone UTF-16 surrogates (U+D800..U+DFFF), which no UTF-8
encoder accepts: written as they are, they would fail the JSON of a whole rollout batch. Every
such code point is replaced by U+FFFD, and the caller records how many were replaced.
"""

from __future__ import annotations

import re
from typing import Any

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> tuple[str, int]:
    """``text`` with every code point UTF-8 cannot encode replaced, and how many there were."""
    return _SURROGATE.subn(REPLACEMENT, text)


def clean(value: Any) -> tuple[Any, int]:
    """:func:`clean_text` over every string inside nested dicts, lists and tuples (keys included)."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        out, total = {}, 0
        for key, item in value.items():
            key, n_key = clean(key)
            out[key], n_item = clean(item)
            total += n_key + n_item
        return out, total
    if isinstance(value, (list, tuple)):
        items = [clean(item) for item in value]
        return type(value)(item for item, _ in items), sum(n for _, n in items)
    return value, 0
