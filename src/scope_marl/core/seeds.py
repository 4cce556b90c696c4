"""The one way the package derives a seed from a base seed and some keys.

Each key folds in as ``value * 1_000_003 + key`` (a prime multiplier, so distinct keys give
distinct streams); a string key enters as its CRC-32, which is stable across processes (Python's
``hash`` of a string is not). ``bits=31`` reduces the result modulo 2**31, for seeds handed to a
backend (OpenAI-compatible servers take signed 32-bit seeds); without it the value is unbounded,
which Python's ``random.Random`` accepts as it is.
"""

from __future__ import annotations

import random
import zlib

MULTIPLIER = 1_000_003


def derive_seed(base: int, *keys: int | str, bits: int | None = None) -> int:
    """``derive_seed(seed, step)`` = ``seed * 1_000_003 + step``; more keys fold in the same way."""
    value = base
    for key in keys:
        value = value * MULTIPLIER + (zlib.crc32(key.encode()) if isinstance(key, str) else key)
    return value % 2**bits if bits is not None else value


def scrambled(seed: int) -> int:
    """``seed`` through SplitMix64's finalizer, for seeding a torch generator.

    Seeds from :func:`derive_seed` for neighbouring keys are arithmetic progressions, and torch's
    Mersenne Twister seeded with them gives streams whose first draws are related: per-episode
    streams seeded that way explored so much less that a learnable toy task stopped improving.
    Scrambling first makes neighbouring seeds start unrelated streams.
    """
    z = (seed + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) >> 1  # 63 bits: torch takes it as a non-negative int64


def shuffled_position(k: int, n: int, seed: int) -> int:
    """The item at position ``k`` of an endless stream of passes over ``n`` items, each pass its own
    shuffle seeded by ``derive_seed(seed, pass)``: how training runs walk their data, so a position
    alone says which item comes (resume needs only the position)."""
    epoch, index = divmod(k, n)
    order = list(range(n))
    random.Random(derive_seed(seed, epoch)).shuffle(order)
    return order[index]
