"""Continuous batching: many sequences decoding together, each admitted and retired on its own.

A :class:`DecodeSession` holds the sequences one :class:`~scope_marl.backends.hf.HFChatModel`
is generating with one set of sampling parameters. Every :meth:`DecodeSession.step` first admits
pending prompts into free slots (their uncached tokens prefilled together, up to a token budget
a step, so a burst of long prompts does not stall the rows already decoding), then samples one
token for every live row and runs one batched forward for the rows that go on. A row that finishes
hands back its :class:`Generation` at once and frees its slot for the next pending prompt: no row
waits for the slowest of its batch, and the rollout engine can queue a conversation's next turn
while its neighbours are still mid-turn.

KV states: a slot keeps its sequence's states in place for the whole turn (``RowCache``); when a
turn ends they are stored under the conversation's cache key (``PrefixCache``), and the next turn
of that conversation starts from them, prefilling only what was said since.

Reproducibility: each row samples from its own generator when it has a seed, so its draws depend
only on its own logits; those can differ in the last bits with the batch's composition (another
row count or span changes the kernels' blocking), never in distribution.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from scope_marl.backends.base import BackendError, ContextLengthError, FinishReason, Generation, SamplingParams, check_adapters
from scope_marl.backends.kv_cache import PrefillCache, RowCache
from scope_marl.backends.prefix_cache import CachedPrefix, common_prefix
from scope_marl.backends.sampling import sample_next
from scope_marl.core.seeds import scrambled

if TYPE_CHECKING:
    from scope_marl.backends.hf import HFChatModel

# Uncached prompt tokens prefilled per step at most (one prompt longer than this is prefilled in
# chunks of this size, its states kept between chunks). Large enough that prefill GEMMs run at full
# speed, small enough that rows already decoding wait at most a few hundred milliseconds.
PREFILL_BUDGET = 4096
# New conversations whose prompts share at least this many leading tokens get that opening
# prefilled once and kept as a shared prefix (tau2's 5,100-token agent prompt, a long system prompt).
MIN_SHARED_PREFIX = 256


@dataclass
class Row:
    """One prompt's decoding state."""

    prompt: list[int]
    adapter: str | None
    key: Hashable | None
    tag: Any = None  # the caller's handle, returned with the generation
    limit: int = 0  # new tokens allowed (max_new_tokens, capped by the context)
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    finish: FinishReason = "length"
    generator: torch.Generator | None = None  # the row's own random stream (per-episode seeds)
    on_token: Callable[[int], None] | None = None  # told each sampled id as it is sampled (streaming)
    private_key: bool = False  # a key made up to carry a chunked prefill; released at the end


@dataclass
class Prefilled:
    """A prefill's result: per row its states (per layer ``[kv_heads, n, head_dim]``) and next-token logits."""

    keys: list[list[torch.Tensor]]  # views into the prefill's buffers
    values: list[list[torch.Tensor]]
    logits: torch.Tensor

    def copies(self, j: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Row ``j``'s states as tensors of their own (to store; a view would keep the whole batch alive)."""
        return [k.clone() for k in self.keys[j]], [v.clone() for v in self.values[j]]


class DecodeSession:
    """Continuous batching over one model with one set of sampling parameters (module docstring)."""

    def __init__(self, chat: HFChatModel, sampling: SamplingParams, generator: torch.Generator | None = None, max_rows: int | None = None):
        self.chat = chat
        self.sampling = sampling
        self.generator = generator  # the shared stream of rows without a seed
        self.max_rows = max_rows or chat.max_batch_size
        cfg = chat.model.config
        self.device = next(chat.model.parameters()).device
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.cache = RowCache(cfg.num_hidden_layers, kv_heads, head_dim, torch.float32, self.device)
        self.pending: deque[Row] = deque()
        self.slots: list[Row | None] = []  # the row in each cache slot; None = free
        self.logits: torch.Tensor | None = None  # next-token logits per slot (rows of free slots unused)

    # ---- public ------------------------------------------------------------------------------
    def add(
        self,
        prompt_ids: list[int],
        adapter: str | None = None,
        key: Hashable | None = None,
        seed: int | None = None,
        on_token: Callable[[int], None] | None = None,
        tag: Any = None,
    ) -> None:
        """Queue a prompt; its generation comes back from a later :meth:`step` with ``tag``."""
        chat = self.chat
        if not prompt_ids:
            raise BackendError("empty prompt: every prompt needs at least one token")
        if len(prompt_ids) >= chat.context_length:
            raise ContextLengthError(
                f"the prompt ({len(prompt_ids)} tokens) fills the model's {chat.context_length}-token context; "
                "shorten the conversation (fewer turns, shorter system prompts)"
            )
        check_adapters([adapter], 1, chat.adapters)
        row = Row([int(t) for t in prompt_ids], adapter, key, tag, on_token=on_token)
        row.limit = min(self.sampling.max_new_tokens, chat.context_length - len(row.prompt))
        if seed is not None:
            row.generator = torch.Generator().manual_seed(scrambled(seed))
        self.pending.append(row)

    @property
    def busy(self) -> bool:
        return bool(self.pending) or any(r is not None for r in self.slots)

    @property
    def tags(self) -> list:
        """The tags of every prompt not yet finished (queued or decoding)."""
        return [r.tag for r in self.pending] + [r.tag for r in self.slots if r is not None]

    @torch.inference_mode()
    def step(self) -> list[tuple[Any, Generation]]:
        """Admit what fits, sample one token per live row, decode the rows that go on. Returns the
        rows that finished in this step as ``(tag, generation)``."""
        self._admit()
        live = [s for s, r in enumerate(self.slots) if r is not None]
        if not live:
            return []
        finished = self._sample(live)
        done = [self._retire(slot) for slot in finished]
        self._compact()
        if any(r is not None for r in self.slots):
            self._decode()
        return done

    # ---- admission and prefill ---------------------------------------------------------------
    def _admit(self) -> None:
        free = [s for s, r in enumerate(self.slots) if r is None] + list(range(len(self.slots), self.max_rows))
        if not self.pending or not free:
            return
        chat = self.chat
        self._share_openings()
        taken: list[tuple[Row, int]] = []  # (row, its item in the prefill)
        # Identical prompts (a GRPO group's rollouts) are prefilled once and their states copied.
        items: list[tuple[list[int], str | None, CachedPrefix | None, int]] = []
        item_of: dict[tuple, int] = {}
        budget = PREFILL_BUDGET
        while self.pending and len(taken) < len(free):
            row = self.pending[0]
            past, reused = chat.prefix_cache.reusable(row.key, row.prompt, row.adapter)
            same = (tuple(row.prompt), row.adapter, id(past), reused)
            fresh = 0 if same in item_of else len(row.prompt) - reused
            if taken and fresh > budget:
                break
            if fresh > PREFILL_BUDGET:  # a long prompt alone: prefill a chunk, keep its states, go on next step
                self._prefill_chunk(row, past, reused)
                break
            if same in item_of:
                chat.prefix_cache.hits += len(row.prompt)
            else:
                item_of[same] = len(items)
                items.append((row.prompt, row.adapter, past, reused))
            taken.append((self.pending.popleft(), item_of[same]))
            budget -= fresh
        if not taken:
            return
        pre = self._prefill(items)
        slots = free[: len(taken)]
        occupied = sum(r is not None for r in self.slots)
        wanted = min(self.max_rows, occupied + len(taken) + len(self.pending))  # grow slots once for what is queued
        self.cache.reserve(max(max(slots) + 1, wanted), max(len(r.prompt) + r.limit for r, _ in taken))
        while len(self.slots) <= max(slots):
            self.slots.append(None)
        if self.logits is None:  # one row per possible slot, allocated once
            self.logits = torch.zeros(self.max_rows, pre.logits.shape[-1], device=self.device)
        for (row, j), slot in zip(taken, slots):
            self.cache.put(slot, pre.keys[j], pre.values[j])
            self.slots[slot] = row
            self.logits[slot] = pre.logits[j]

    def _share_openings(self) -> None:
        """Prefill once the opening that several waiting new conversations share (same adapter, at
        least MIN_SHARED_PREFIX common leading tokens no stored state covers yet), and keep it shared:
        each row then prefills only the rest of its prompt."""
        cache = self.chat.prefix_cache
        fresh: dict[tuple, list[Row]] = {}
        for row in self.pending:
            if len(row.prompt) <= MIN_SHARED_PREFIX:
                continue
            _, covered = cache.reusable(row.key, row.prompt, row.adapter)
            if covered < MIN_SHARED_PREFIX:
                fresh.setdefault((row.adapter, tuple(row.prompt[:MIN_SHARED_PREFIX])), []).append(row)
        for (adapter, _), members in fresh.items():
            if len(members) < 2:
                continue
            head = members[0].prompt
            length = min(common_prefix(np.asarray(head), r.prompt, len(r.prompt) - 1) for r in members)
            key = ("shared-opening", adapter, length)
            pre = self._prefill([(head[:length], adapter, None, 0)])
            cache.store(key, CachedPrefix(head[:length], adapter, *pre.copies(0)))
            cache.share(key)

    def _prefill_chunk(self, row: Row, past: CachedPrefix | None, reused: int) -> None:
        if row.key is None:
            row.key, row.private_key = ("chunked-prefill", id(row)), True
        end = reused + PREFILL_BUDGET
        pre = self._prefill([(row.prompt[:end], row.adapter, past, reused)])
        self.chat.prefix_cache.store(row.key, CachedPrefix(row.prompt[:end], row.adapter, *pre.copies(0)))

    def _prefill(self, items: list[tuple[list[int], str | None, CachedPrefix | None, int]]) -> Prefilled:
        """Run ``(prompt, adapter, cached prefix, tokens it covers)`` items through the model together:
        cached columns restored, the rest computed. Queries are left-padded; each row's states sit in
        columns ``[0, len(prompt))`` (``PrefillCache``), so a row computes the same numbers alone or
        batched."""
        chat = self.chat
        cfg = chat.model.config
        clock = time.perf_counter()
        reused = torch.tensor([r for _, _, _, r in items], device=self.device)
        fresh = torch.tensor([len(p) for p, _, _, _ in items], device=self.device) - reused
        width = int(fresh.max())
        pad = width - fresh  # padding queries at the front of each row
        t = torch.arange(width, device=self.device)[None, :]
        real = t >= pad[:, None]
        # Real query t writes column reused + (t - pad); padding queries write past the row's end.
        write = torch.where(real, reused[:, None] + t - pad[:, None], reused[:, None] + fresh[:, None] + t)
        columns = int((reused + width).max())
        cache = PrefillCache(cfg.num_hidden_layers, self.cache.kv_heads, self.cache.head_dim, write, columns, torch.float32, self.device)
        ids = torch.full((len(items), width), chat.pad_id, dtype=torch.long, device=self.device)
        for j, (prompt, _, past, n) in enumerate(items):
            ids[j, width - len(prompt) + n :] = torch.tensor(prompt[n:], dtype=torch.long)
            if past is not None:
                for layer in range(cfg.num_hidden_layers):
                    cache.keys[layer][j, :, :n] = past.keys[layer][:, :n]
                    cache.values[layer][j, :, :n] = past.values[layer][:, :n]
        chat.prefix_cache.hits += int(reused.sum())
        chat.prefix_cache.misses += int(fresh.sum())
        cols = torch.arange(columns, device=self.device)[None, None, :]
        own = write[:, :, None]
        # A real query sees its row's columns up to its own; a padding query only its own column
        # (a fully masked row would make SDPA return NaN).
        mask = torch.where(real[:, :, None], cols <= own, cols == own)[:, None]
        positions = torch.where(real, write, 0)
        names = chat.adapter_names([a for _, a, _, _ in items])
        logits = chat.forward(cache, ids, positions, mask, names)
        keys = [[k[j, :, : len(p)] for k in cache.keys] for j, (p, _, _, _) in enumerate(items)]
        values = [[v[j, :, : len(p)] for v in cache.values] for j, (p, _, _, _) in enumerate(items)]
        chat.timings["prefill_s"] += time.perf_counter() - clock
        return Prefilled(keys, values, logits)

    # ---- decoding ----------------------------------------------------------------------------
    def _sample(self, live: list[int]) -> list[int]:
        """Sample one token for each live slot; returns the slots whose row finished."""
        chat, sampling = self.chat, self.sampling
        clock = time.perf_counter()
        contiguous = live[-1] == len(live) - 1
        logits = self.logits[: len(live)] if contiguous else self.logits[torch.tensor(live, device=self.device)]
        rows = [self.slots[s] for s in live]
        streams = [r.generator for r in rows] if rows[0].generator is not None else self.generator
        if isinstance(streams, list) and any(g is None for g in streams):
            raise BackendError("rows with and without seeds cannot share a session; give every prompt a seed or none")
        tok, lp, ent = sample_next(logits, sampling, streams)
        chat.timings["sample_s"] += time.perf_counter() - clock
        finished = []
        self._next_tokens = torch.full((len(self.slots),), chat.pad_id, dtype=torch.long, device=self.device)
        for slot, row, t, logprob, e in zip(live, rows, tok.tolist(), lp.tolist(), ent.tolist()):
            row.out.append(t)
            row.logprobs.append(logprob)
            row.entropies.append(e)
            if row.on_token is not None:
                row.on_token(t)
            if t in chat.stop_ids or (sampling.stop and chat.hit_stop(row.out, sampling.stop)):
                row.finish = "stop"
                finished.append(slot)
            elif len(row.out) >= row.limit:
                finished.append(slot)
            else:
                self._next_tokens[slot] = t
        return finished

    def _retire(self, slot: int) -> tuple[Any, Generation]:
        """Store a finished row's states under its key (prompt + all but its last sampled token), free its slot."""
        row = self.slots[slot]
        if row.private_key:
            self.chat.prefix_cache.release([row.key])
        elif row.key is not None:
            keys, values = self.cache.states(slot)
            ids = row.prompt + row.out[: keys[0].shape[1] - len(row.prompt)]
            assert len(ids) == keys[0].shape[1], "cache columns and tokens disagree"
            self.chat.prefix_cache.store(row.key, CachedPrefix(ids=ids, adapter=row.adapter, keys=keys, values=values))
        self.slots[slot] = None
        self.cache.free(slot)
        return row.tag, self.chat.finish(row, self.sampling)

    def _compact(self) -> None:
        """Keep the live rows in the front slots while nothing waits to fill a free one (a free slot
        inside the batch still costs its share of every decode step). Rows with their own seeds move
        the last live row into each hole (one row's states copied per hole); rows drawing from one
        shared stream keep their order (the stream's numbers go to rows in slot order), so the rows
        after a hole shift down."""
        while self.slots and self.slots[-1] is None:
            self.slots.pop()
        if self.pending or all(r is not None for r in self.slots):
            return
        live = [s for s, r in enumerate(self.slots) if r is not None]
        if self.slots[live[0]].generator is not None:
            moves = []
            holes = [s for s, r in enumerate(self.slots) if r is None]
            for hole, source in zip(holes, reversed(live)):
                if source > hole:
                    moves.append((source, hole))
        else:
            moves = [(source, target) for target, source in enumerate(live) if source != target]
        for source, target in moves:
            self.cache.move(source, target)
            self.slots[target], self.slots[source] = self.slots[source], None
            self._next_tokens[target] = self._next_tokens[source]
        while self.slots and self.slots[-1] is None:
            self.slots.pop()

    def _decode(self) -> None:
        chat = self.chat
        n = len(self.slots)
        live = torch.tensor([r is not None for r in self.slots], device=self.device)
        clock = time.perf_counter()
        mask = self.cache.begin_step(n)
        positions = self.cache.lengths[:n, None].clone()
        names = chat.adapter_names([r.adapter if r is not None else None for r in self.slots])
        self.logits[:n] = chat.forward(self.cache, self._next_tokens[:n, None], positions, mask, names)
        self.cache.end_step(live)
        chat.timings["decode_s"] += time.perf_counter() - clock
        chat.steps_by_rows[int(live.sum())] += 1
