"""The key/value cache of continuous batching: one slot per sequence, every step one packed forward.

A :class:`RowCache` holds one slot (batch row of its buffers) per live sequence; a slot's tokens sit
in columns ``[0, length)``. One forward pass (a *step*) carries, packed one token after another,
the next token of every decoding sequence and chunks of prompts being prefilled (each chunk
appends at its slot's own columns), so the weights are read once a step for both and no prompt is
padded to its neighbours' length. :meth:`RowCache.begin_step` lays a step out; ``update`` (called
by the model per layer) writes each token's key/value at its slot and column, and :meth:`attend`
(called by the attention function, ``backends.attention``) computes each token's attention over
its own slot:

* decoding tokens together: one call of ``backends.rows_attention``'s compiled op, which reads each
  row's own columns only (where it cannot be built: one SDPA call over slots ``[0, n)`` up to the
  longest length, each row masked to its own columns, grouped query heads packed per key/value head);
* each prefill chunk on its own: SDPA, causal over its slot's columns ``[0, start + count)``.

A token therefore sees exactly the columns it would see alone, whatever shares its step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class RowCache:
    """One slot per sequence, each with its own length; one packed step at a time (module docstring).

    Buffers grow when a sequence needs more columns or slots than allocated (zeroed for the SDPA
    fallback, so masked columns hold finite numbers: attention multiplies them by an exact 0).
    """

    GROWTH = 1.5  # capacity grows geometrically, so appending columns costs amortized O(1) copies

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, dtype, device, compiled: bool = True):
        """``compiled=False`` decodes with SDPA even where the compiled op builds (the reference it is tested against)."""
        self.num_layers, self.kv_heads, self.head_dim = num_layers, kv_heads, head_dim
        self.rows_attention = None
        if compiled and dtype == torch.float32 and torch.device(device).type == "cpu":
            from .rows_attention import load

            self.rows_attention = load()
        self.dtype, self.device = dtype, device
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.lengths = torch.zeros(0, dtype=torch.long, device=device)
        # Stands in for the mask transformers would otherwise build (a prepared 4-D mask passes through untouched).
        self.no_mask = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)
        self._step: _Step | None = None

    @property
    def slots(self) -> int:
        return self.lengths.shape[0]

    @property
    def columns(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    @property
    def bytes_per_column(self) -> int:
        """Bytes one token's keys and values take over all layers (46,080 for SmolLM2-135M in fp32)."""
        return 2 * self.num_layers * self.kv_heads * self.head_dim * self.dtype.itemsize

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
        # The compiled op reads only written columns, so its buffers need no zeroing (and pages never
        # written are never faulted in: a slot costs memory for the columns it holds, not for the
        # capacity); SDPA's masked read needs finite numbers everywhere.
        allocate = torch.empty if self.rows_attention is not None else torch.zeros
        held = [(slot, n) for slot, n in enumerate(self.lengths.tolist()) if n]
        for buffers in (self.keys, self.values):
            old = list(buffers)
            buffers.clear()
            for layer in range(self.num_layers):
                buffers.append(allocate(shape, dtype=self.dtype, device=self.device))
                if old:
                    for slot, n in held:  # each slot's own columns only, so no page beyond them is touched
                        buffers[layer][slot, :, :n] = old[layer][slot, :, :n]
                    old[layer] = None  # freed as it goes: the peak is one layer over the new size, not twice the cache
        lengths = torch.zeros(new_slots, dtype=torch.long, device=self.device)
        lengths[: self.slots] = self.lengths
        self.lengths = lengths

    def put(self, slot: int, keys: list[torch.Tensor], values: list[torch.Tensor], n: int) -> None:
        """Fill ``slot`` with the first ``n`` columns of a sequence's states (per layer ``[kv_heads, >= n, head_dim]``)."""
        for layer in range(self.num_layers):
            self.keys[layer][slot, :, :n] = keys[layer][:, :n]
            self.values[layer][slot, :, :n] = values[layer][:, :n]
        self.lengths[slot] = n

    def states(self, slot: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of ``slot``'s states (per layer ``[kv_heads, length, head_dim]``)."""
        n = int(self.lengths[slot])
        return [k[slot, :, :n].clone() for k in self.keys], [v[slot, :, :n].clone() for v in self.values]

    def copy(self, source: int, target: int) -> None:
        """Give slot ``target`` the states of slot ``source`` (both keep them)."""
        n = int(self.lengths[source])
        for buffers in (self.keys, self.values):
            for layer in range(self.num_layers):
                buffers[layer][target, :, :n] = buffers[layer][source, :, :n]
        self.lengths[target] = n

    def move(self, source: int, target: int) -> None:
        """Move a sequence from slot ``source`` to slot ``target`` (compaction); ``source`` becomes free."""
        self.copy(source, target)
        self.lengths[source] = 0

    def keep(self, slot: int, n: int) -> None:
        """Keep the first ``n`` columns of ``slot`` (a conversation's next turn, in place) and drop the rest."""
        self.lengths[slot] = min(n, int(self.lengths[slot]))

    def free(self, slot: int) -> None:
        self.lengths[slot] = 0

    # ---- one packed step ---------------------------------------------------------------------
    def begin_step(self, decode: list[int], chunks: list[tuple[int, int, int]]) -> torch.Tensor:
        """Lay out a step: token ``i < len(decode)`` is the next token of slot ``decode[i]`` (written at
        its slot's length), then each chunk ``(slot, start, count)`` in order. Returns each token's
        position (its column)."""
        self._step = _Step(self, decode, chunks, masks=self.rows_attention is None)
        return self._step.column

    def end_step(self) -> None:
        """Advance every slot by what the step wrote."""
        step, self._step = self._step, None
        if step.decode_slots is not None:
            self.lengths[step.decode_slots] += 1
        for slot, start, count in step.chunks:
            self.lengths[slot] = start + count

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """Write the step's keys/values (``[tokens, kv_heads, 1, head_dim]``) at each token's slot and column."""
        step = self._step
        self.keys[layer_idx][step.slot, :, step.column] = key_states[:, :, 0]
        self.values[layer_idx][step.slot, :, step.column] = value_states[:, :, 0]
        return key_states, value_states  # attention reads the cache itself (attend)

    def attend(self, layer: int, query: torch.Tensor, scale: float | None) -> torch.Tensor:
        """Attention of the step's tokens (``query``: ``[tokens, heads, 1, head_dim]``) over their own
        slots; returns ``[tokens, 1, heads, head_dim]``."""
        step = self._step
        tokens, heads, _, dim = query.shape
        out = query.new_empty(tokens, heads, dim)
        keys, values = self.keys[layer], self.values[layer]
        if step.decoding and self.rows_attention is not None:
            q = query[: step.decoding, :, 0].contiguous()
            out[: step.decoding] = self.rows_attention(
                q, keys, values, step.decode_slots, step.visible, dim**-0.5 if scale is None else scale
            )
        elif step.decoding:
            n, span, nd = step.region, step.span, step.decoding
            q = query[:nd, :, 0]
            if step.scattered is not None:  # decoding slots with gaps: queries placed at their slots
                q = query.new_zeros(n, heads, dim).index_copy_(0, step.scattered, q)
            # Grouped heads packed per key/value head: [n, kv_heads, group, dim] against [n, kv_heads, span, dim].
            q = q.reshape(n, self.kv_heads, heads // self.kv_heads, dim)
            o = F.scaled_dot_product_attention(q, keys[:n, :, :span], values[:n, :, :span], attn_mask=step.decode_mask, scale=scale)
            o = o.reshape(n, heads, dim)
            out[:nd] = o if step.scattered is None else o.index_select(0, step.scattered)
        offset = step.decoding
        for (slot, start, count), mask in zip(step.chunks, step.chunk_masks):
            q = query[offset : offset + count, :, 0].transpose(0, 1)[None]
            end = start + count
            o = F.scaled_dot_product_attention(
                q, keys[slot : slot + 1, :, :end], values[slot : slot + 1, :, :end], attn_mask=mask, scale=scale, enable_gqa=True
            )
            out[offset : offset + count] = o[0].transpose(0, 1)
            offset += count
        return out[:, None]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # positions are always passed explicitly


class _Step:
    """Where one packed step's tokens go (slot and column per token) and the masks its attention uses."""

    def __init__(self, cache: RowCache, decode: list[int], chunks: list[tuple[int, int, int]], masks: bool):
        device = cache.device
        self.chunks = chunks
        self.decoding = len(decode)
        columns = []
        slots = []
        self.decode_slots = None
        self.scattered = None
        if decode:
            self.decode_slots = torch.tensor(decode, device=device)
            written = cache.lengths[self.decode_slots]  # each row writes its token at its length...
            self.visible = written + 1  # ...and sees every column up to that one
            if masks:  # SDPA's layout: slots [0, region) at once, each masked to its own columns
                self.region = max(decode) + 1
                if self.region != len(decode):
                    self.scattered = self.decode_slots
                lengths = cache.lengths[: self.region]
                self.span = int(lengths.max()) + 1
                cols = torch.arange(self.span, device=device)
                # Rows in the region that do not decode get the same harmless mask (their output is dropped).
                self.decode_mask = (cols[None, :] <= lengths[:, None])[:, None, None, :]
            slots.append(self.decode_slots)
            columns.append(written)
        self.chunk_masks = []
        for slot, start, count in chunks:
            slots.append(torch.full((count,), slot, dtype=torch.long, device=device))
            columns.append(torch.arange(start, start + count, device=device))
            cols = torch.arange(start + count, device=device)
            self.chunk_masks.append(cols[None, :] <= (start + torch.arange(count, device=device))[:, None])
        self.slot = torch.cat(slots)
        self.column = torch.cat(columns)
