"""Key/value states of earlier turns, kept per conversation so a follow-up prompt prefills only its new tokens.

In a multi-turn rollout each role's prompt for turn t+1 is its prompt for turn t, plus what it
sampled, plus the other role's reply. Re-encoding the whole history every turn would cost several
times the decoding itself; with this store a turn only prefills the other role's reply. Entries
are keyed by the caller (the rollout engine uses ``(episode_id, role)``) and must be released when
a conversation ends; the engine's cap on concurrent episodes bounds the memory.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

import torch


@dataclass
class CachedPrefix:
    ids: list[int]  # the tokens whose key/value states are stored, in order
    adapter: str | None  # states depend on the adapter that computed them
    keys: list[torch.Tensor]  # per layer [kv_heads, len(ids), head_dim]
    values: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


class PrefixCache:
    def __init__(self) -> None:
        self._entries: dict[Hashable, CachedPrefix] = {}
        self.hits = 0  # prompt tokens served from the store, for throughput accounting
        self.misses = 0  # prompt tokens that had to be prefilled

    def reusable(self, key: Hashable | None, prompt: list[int], adapter: str | None) -> tuple[CachedPrefix | None, int]:
        """The stored entry for ``key`` and how many leading prompt tokens it covers.

        At least one prompt token is always left to prefill: the model needs it to produce the
        next-token logits.
        """
        entry = self._entries.get(key) if key is not None else None
        if entry is None or entry.adapter != adapter:
            return None, 0
        limit = min(len(entry.ids), len(prompt) - 1)
        n = 0
        while n < limit and entry.ids[n] == prompt[n]:
            n += 1
        return (entry, n) if n else (None, 0)

    def store(self, key: Hashable, entry: CachedPrefix) -> None:
        self._entries[key] = entry

    def release(self, keys: Iterable[Hashable]) -> None:
        for key in keys:
            self._entries.pop(key, None)

    def clear(self) -> None:
        """Forget everything, e.g. after the model's weights changed."""
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())
