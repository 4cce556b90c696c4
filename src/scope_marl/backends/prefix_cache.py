"""Key/value states of earlier turns, kept per conversation so a follow-up prompt prefills only its new tokens.

In a multi-turn rollout each role's prompt for turn t+1 is its prompt for turn t, plus what it
sampled, plus the other role's reply. Re-encoding the whole history every turn would cost several
times the decoding itself; with this store a turn only prefills the other role's reply. Entries
are keyed by the caller (the rollout engine uses ``(episode_id, role)``) and must be released when
a conversation ends; the engine's cap on concurrent episodes bounds the memory.

An entry holds its states one of two ways. A :class:`CachedPrefix` owns copies. A
:class:`SlotPrefix` points at the slot of a decoding session's cache (``backends.kv_cache``) where
the turn that produced them left them: the session that owns the slot hands it to the
conversation's next turn as it is (no copy; the turn appends what was said since), and keeps the
slot out of use until the entry is taken, released or replaced. Any other reader copies from the
slot. So the engine's long-lived session moves no states between turns at all.

Conversations of one environment also share a long opening: tau2's agent prompt is the same
5,100 tokens (instructions, policy, tool schemas) in every episode. The backend prefills such a
common prefix once and keeps it as a *shared* entry (the few most recent, any key may read them),
so a new conversation starts from it instead of prefilling the whole prompt again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from scope_marl.backends.kv_cache import RowCache

MAX_SHARED = 4  # shared prefixes kept (each is one conversation opening's states)


@dataclass
class CachedPrefix:
    ids: list[int]  # the tokens whose key/value states are stored, in order
    adapter: str | None  # states depend on the adapter that computed them
    keys: list[torch.Tensor]  # per layer [kv_heads, len(ids), head_dim]
    values: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@dataclass(eq=False)
class SlotPrefix:
    """States left in place in slot ``slot`` of a session's ``cache`` (columns ``[0, len(ids))``)."""

    ids: list[int]
    adapter: str | None
    cache: RowCache
    slot: int

    @property
    def keys(self) -> list[torch.Tensor]:
        """Per layer a view ``[kv_heads, columns, head_dim]`` of the slot (its first ``len(ids)`` columns are the states)."""
        return [k[self.slot] for k in self.cache.keys]

    @property
    def values(self) -> list[torch.Tensor]:
        return [v[self.slot] for v in self.cache.values]

    @property
    def nbytes(self) -> int:
        return len(self.ids) * self.cache.bytes_per_column


class PrefixCache:
    def __init__(self) -> None:
        self._entries: dict[Hashable, CachedPrefix | SlotPrefix] = {}
        self._shared: OrderedDict[tuple, tuple[CachedPrefix, np.ndarray]] = OrderedDict()
        self.hits = 0  # prompt tokens served from the store, for throughput accounting
        self.misses = 0  # prompt tokens that had to be prefilled

    def reusable(self, key: Hashable | None, prompt: list[int], adapter: str | None) -> tuple[CachedPrefix | SlotPrefix | None, int]:
        """The stored entry for ``key`` and how many leading prompt tokens it covers.

        At least one prompt token is always left to prefill: the model needs it to produce the
        next-token logits.
        """
        best: tuple[CachedPrefix | None, int] = (None, 0)
        entry = self._entries.get(key) if key is not None else None
        if entry is not None and entry.adapter == adapter:
            best = (entry, common_prefix(np.asarray(entry.ids), prompt, len(prompt) - 1))
        used = None
        for shared_key, (shared, ids) in self._shared.items():
            if shared.adapter == adapter and len(ids) > best[1]:
                n = common_prefix(ids, prompt, len(prompt) - 1)
                if n > best[1]:
                    best, used = (shared, n), shared_key
        if used is not None:
            self._shared.move_to_end(used)  # the most recently used shared prefixes are kept
        return best if best[1] else (None, 0)

    def store(self, key: Hashable, entry: CachedPrefix | SlotPrefix) -> None:
        self._entries[key] = entry

    def get(self, key: Hashable) -> CachedPrefix | SlotPrefix | None:
        return self._entries.get(key)

    def pop(self, key: Hashable) -> CachedPrefix | SlotPrefix | None:
        """Take ``key``'s entry out (its next turn now owns the states and stores them again when it ends)."""
        return self._entries.pop(key, None)

    def share(self, key: Hashable) -> None:
        """Make the entry stored under ``key`` a shared one (the oldest shared entry beyond MAX_SHARED goes)."""
        entry = self._entries.pop(key)
        self._shared[(entry.adapter, len(entry.ids), hash(tuple(entry.ids)))] = (entry, np.asarray(entry.ids))
        while len(self._shared) > MAX_SHARED:
            self._shared.popitem(last=False)

    def release(self, keys: Iterable[Hashable]) -> None:
        for key in keys:
            self._entries.pop(key, None)

    def forget_adapter(self, adapter: str) -> None:
        """Drop every state computed with ``adapter`` (it was removed; a new adapter may take its name)."""
        for key in [k for k, e in self._entries.items() if e.adapter == adapter]:
            del self._entries[key]
        for key in [k for k, (e, _) in self._shared.items() if e.adapter == adapter]:
            del self._shared[key]

    def clear(self) -> None:
        """Forget everything, e.g. after the model's weights changed."""
        self._entries.clear()
        self._shared.clear()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values()) + sum(e.nbytes for e, _ in self._shared.values())


def common_prefix(ids: np.ndarray, prompt: list[int], limit: int) -> int:
    """Leading tokens ``ids`` and ``prompt`` share, at most ``limit``."""
    n = min(len(ids), len(prompt), limit)
    if n <= 0:
        return 0
    differ = np.flatnonzero(ids[:n] != np.asarray(prompt[:n]))
    return int(differ[0]) if len(differ) else n
