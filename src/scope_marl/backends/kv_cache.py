"""Key/value caches for the hand-written decode loop (the two methods transformers' attention calls).

Two layouts, one per phase:

* :class:`PrefillCache` serves a *prefill*: a batch of new prompts, each row's states written to
  its own columns ``[0, n)``. It lives for one forward pass.
* :class:`RowCache` serves *decoding* under continuous batching: one slot (batch row) per live
  sequence, each with its own length. A slot's tokens sit in columns ``[0, length)``; a decode step
  writes each row's new key/value at that row's own column, so sequences of any length decode
  together and a finished slot can take a new sequence without touching its neighbours.

Both return views of preallocated buffers, so nothing is re-concatenated per token.
"""

from __future__ import annotations

import torch


class PrefillCache:
    """A prefill's batch, laid out so every row's states land in columns ``[0, n)`` as if it ran alone.

    Queries are left-padded (so the last query of every row is its last prompt token and only that
    position needs the LM head), but each row writes its keys/values at its own columns: its cached
    prefix first, its new tokens right after, its padding queries beyond them (masked for the real
    queries, so harmless). A row's attention therefore covers the same columns in the same order
    whatever its neighbours, and its logits do not depend on the batch's padding.
    """

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, write: torch.Tensor, columns: int, dtype, device):
        batch, width = write.shape
        shape = (batch, kv_heads, columns, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self._index = write[:, None, :, None].expand(batch, kv_heads, width, head_dim)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.keys[layer_idx].scatter_(2, self._index, key_states)
        self.values[layer_idx].scatter_(2, self._index, value_states)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # positions and the mask are always passed explicitly


class RowCache:
    """One slot per decoding sequence, each slot with its own length (continuous batching).

    ``begin_step(rows)`` fixes which slots a decode forward covers (``[0, rows)``, free slots
    included: they decode a padding token into their column 0 and are masked); ``update`` then
    writes each row's single new key/value at column ``lengths[row]``; ``end_step`` advances the
    live slots. Buffers grow (zeroed, so masked columns hold finite numbers: attention multiplies
    them by an exact 0) when a sequence needs more columns or slots than allocated.
    """

    GROWTH = 1.5  # capacity grows geometrically, so appending columns costs amortized O(1) copies

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, dtype, device):
        self.num_layers, self.kv_heads, self.head_dim = num_layers, kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.lengths = torch.zeros(0, dtype=torch.long, device=device)
        self._rows = torch.zeros(0, dtype=torch.long, device=device)
        self._span = 1

    @property
    def slots(self) -> int:
        return self.lengths.shape[0]

    @property
    def columns(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def reserve(self, slots: int, columns: int) -> None:
        """Make room for ``slots`` slots of ``columns`` columns each (existing contents kept)."""
        if slots <= self.slots and columns <= self.columns:
            return
        new_slots = max(slots, self.slots)
        new_cols = max(columns, self.columns if columns <= self.columns else int(self.columns * self.GROWTH))
        shape = (new_slots, self.kv_heads, new_cols, self.head_dim)
        used = int(self.lengths.max()) if self.slots else 0
        for buffers in (self.keys, self.values):
            old = list(buffers)
            buffers.clear()
            for layer in range(self.num_layers):
                buffers.append(torch.zeros(shape, dtype=self.dtype, device=self.device))
                if old:
                    buffers[layer][: self.slots, :, :used] = old[layer][:, :, :used]
        lengths = torch.zeros(new_slots, dtype=torch.long, device=self.device)
        lengths[: self.slots] = self.lengths
        self.lengths = lengths

    def put(self, slot: int, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Fill ``slot`` with a sequence's states (per layer ``[kv_heads, n, head_dim]``)."""
        n = keys[0].shape[1]
        for layer in range(self.num_layers):
            self.keys[layer][slot, :, :n] = keys[layer]
            self.values[layer][slot, :, :n] = values[layer]
        self.lengths[slot] = n

    def states(self, slot: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of ``slot``'s states (per layer ``[kv_heads, length, head_dim]``)."""
        n = int(self.lengths[slot])
        return [k[slot, :, :n].clone() for k in self.keys], [v[slot, :, :n].clone() for v in self.values]

    def move(self, source: int, target: int) -> None:
        """Move a sequence from slot ``source`` to slot ``target`` (compaction); ``source`` becomes free."""
        n = int(self.lengths[source])
        for buffers in (self.keys, self.values):
            for layer in range(self.num_layers):
                buffers[layer][target, :, :n] = buffers[layer][source, :, :n]
        self.lengths[target], self.lengths[source] = n, 0

    def free(self, slot: int) -> None:
        self.lengths[slot] = 0

    def begin_step(self, rows: int) -> torch.Tensor:
        """Prepare a decode forward over slots ``[0, rows)``; returns the boolean key mask ``[rows, 1, 1, span]``."""
        self._rows = torch.arange(rows, device=self.device)
        lengths = self.lengths[:rows]
        self._span = int(lengths.max()) + 1
        cols = torch.arange(self._span, device=self.device)
        return (cols[None, :] <= lengths[:, None])[:, None, None, :]

    def end_step(self, live: torch.Tensor) -> None:
        """Advance the slots that decoded a real token (``live``: boolean per slot of the step)."""
        self.lengths[: live.shape[0]] += live.long()

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        write = self.lengths[: key_states.shape[0]]
        self.keys[layer_idx][self._rows, :, write] = key_states[:, :, 0]
        self.values[layer_idx][self._rows, :, write] = value_states[:, :, 0]
        rows = key_states.shape[0]
        return self.keys[layer_idx][:rows, :, : self._span], self.values[layer_idx][:rows, :, : self._span]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._span - 1
