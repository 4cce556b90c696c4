"""Decode attention that reads each row's own length of cache: a small C++ op, built on first use.

A continuous-batching decode step (``backends.kv_cache``) attends each decoding row over its own
slot, and the rows' lengths differ by hundreds of columns. torch's SDPA can only take them padded
to the longest row with a mask, so it reads (and multiplies) the padding too, and its masked path
computes the whole score matrix before the softmax. ``rows_attention.cpp`` streams exactly each
row's columns, reading every key and value once for the query heads that share it.
``bench/decode_attention.py`` on the rollout bench's step shape (47 of 64 slots, 20-399 columns, 2
cores): 1.15 ms a layer against SDPA's 4.28 ms, the same numbers within 1e-6; the whole 64-episode
rollout, alternating both ways in one process, ran 8-15% faster. Prefill chunks stay on SDPA:
with many queries per key its matrix-product kernel is the faster one there.

The op is compiled on first use by ``backends.kernels`` (7-10 s with g++) and runs on torch's
own thread pool. Where no compiler works, decoding uses SDPA and says so once: same results,
slower attention.
"""

from __future__ import annotations

from collections.abc import Callable

from . import kernels


def load() -> Callable | None:
    """``rows_attention(query [tokens, heads, dim], keys, values [slots, kv_heads, columns, dim],
    slot [tokens], visible [tokens], scale) -> [tokens, heads, dim]``: each token's attention over
    columns ``[0, visible)`` of its slot. ``None`` (with one warning) where it cannot be built."""
    return kernels.load("rows_attention", "decode attention falls back to torch's SDPA (same results, slower decode attention)")
