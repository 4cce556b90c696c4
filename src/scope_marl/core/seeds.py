"""The one way the package derives a seed from a base seed and some keys.

Each key folds in as ``value * 1_000_003 + key`` (a prime multiplier, so distinct keys give
distinct streams); a string key enters as its CRC-32, which is stable across processes (Python's
``hash`` of a string is not). ``bits=31`` reduces the result modulo 2**31, for seeds handed to a
backend (OpenAI-compatible servers take signed 32-bit seeds); without it the value is unbounded,
which Python's ``random.Random`` accepts as it is.
"""

from __future__ import annotations

import zlib

MULTIPLIER = 1_000_003


def derive_seed(base: int, *keys: int | str, bits: int | None = None) -> int:
    """``derive_seed(seed, step)`` = ``seed * 1_000_003 + step``; more keys fold in the same way."""
    value = base
    for key in keys:
        value = value * MULTIPLIER + (zlib.crc32(key.encode()) if isinstance(key, str) else key)
    return value % 2**bits if bits is not None else value
