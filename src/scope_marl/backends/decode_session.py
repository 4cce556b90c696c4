"""Continuous batching: many sequences decoding together, each admitted and retired on its own.

A :class:`DecodeSession` holds the sequences one :class:`~scope_marl.backends.hf.HFChatModel`
is generating with one set of sampling parameters. Every :meth:`DecodeSession.step` samples one
token for every row whose logits are ready, hands back the rows that finished (freeing their
slots), admits pending prompts into free slots, and runs *one* packed forward pass: the next token
of every row that goes on plus chunks of the prompts being prefilled (at most PREFILL_BUDGET prompt
tokens a step, so a burst of long prompts does not stall the rows already decoding). The weights
are read once a step for both, and no prompt is padded to its neighbours' length. No row waits for
the slowest of its batch, and the rollout engine can queue a conversation's next turn while its
neighbours are still mid-turn.

KV states stay in place for the whole conversation: a slot keeps its sequence's states
(``RowCache``), and a prompt's chunks are appended at its slot's own columns. When a turn with a
cache key ends, its slot is *parked*: the states stay where they are and the conversation's entry
in the model's ``PrefixCache`` points at the slot (``SlotPrefix``). The conversation's next turn
takes that very slot, keeps the columns its prompt still shares (the prompt so far and the reply,
all but the last sampled token) and prefills only what was said since, so no states are copied
between turns. Parked slots are kept out of use until their entry is taken, released (the
conversation ended) or replaced; the session holds at most ``max_rows`` live rows and
``max_rows + max_parked`` slots in all, and when a new row finds none free, the longest-parked
slot's states are copied out into the prefix cache (a *spill*) to make room. :meth:`close` spills
whatever is still parked, so a later session (``generate_ids`` opens one per call) starts from
copies. What remains of moving states around is counted in ``timings["copy_s"]``: spills, a
GRPO group's identical first prompts copied from the one that was prefilled, and compaction.

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
from scope_marl.backends.kv_cache import RowCache
from scope_marl.backends.prefix_cache import CachedPrefix, SlotPrefix, common_prefix
from scope_marl.backends.sampling import sample_next
from scope_marl.core.seeds import scrambled

if TYPE_CHECKING:
    from scope_marl.backends.hf import HFChatModel

# Uncached prompt tokens prefilled per step at most (a longer prompt is prefilled a chunk per step,
# its states kept in its slot between chunks). Large enough that prefill GEMMs run at full speed,
# small enough that a burst of new prompts delays the rows already decoding by a few seconds at most.
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
    slot: int = -1  # its cache slot once admitted
    filled: int = 0  # prompt tokens whose states are in its slot (the prompt is in when all are)
    twin: Row | None = None  # an identical prompt admitted with it: its states are copied from there
    decoding: bool = False  # sampled a token this step that the step's forward must run


class DecodeSession:
    """Continuous batching over one model with one set of sampling parameters (module docstring)."""

    def __init__(
        self,
        chat: HFChatModel,
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
        max_rows: int | None = None,
        max_parked: int | None = None,
    ):
        """``max_rows`` rows decode at once (default the model's ``max_batch_size``); ``max_parked``
        (default ``max_rows``) more slots may hold finished turns' states for their next turn."""
        self.chat = chat
        self.sampling = sampling
        self.generator = generator  # the shared stream of rows without a seed
        self.max_rows = max_rows or chat.max_batch_size
        self.max_parked = self.max_rows if max_parked is None else max_parked
        cfg = chat.model.config
        self.device = chat.device
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.cache = RowCache(cfg.num_hidden_layers, kv_heads, head_dim, chat.dtype, self.device, compiled=chat.compiled_attention)
        chat.calibrate_packing()
        self.pending: deque[Row] = deque()
        self.slots: list[Row | None] = []  # the live row in each cache slot; None = no live row (free or parked)
        self.parked: dict[int, tuple[Hashable, SlotPrefix]] = {}  # slot -> the key and entry it holds, oldest first
        self.logits: torch.Tensor | None = None  # next-token logits per slot (rows of free slots unused)
        self._next_tokens = torch.full((self.slot_space,), chat.pad_id, dtype=torch.long, device=self.device)  # per slot

    @property
    def slot_space(self) -> int:
        """Slots the session may use: live rows plus parked turns."""
        return self.max_rows + self.max_parked

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
    def close(self) -> None:
        """Copy the states of every parked slot out into the prefix cache, so they outlive this
        session's cache (the next session of the conversation copies them in)."""
        self._reclaim()
        while self.parked:
            self._spill_oldest()

    @torch.inference_mode()
    def step(self) -> list[tuple[Any, Generation]]:
        """Sample one token for every row whose logits are ready, admit what fits, then run one
        packed forward: the next token of every row that goes on and the prefill chunks of this
        step. Returns the rows that finished in this step as ``(tag, generation)``."""
        finished = self._sample()
        done = [self._retire(slot) for slot in finished]
        self._admit()
        self._compact()
        self._forward()
        return done

    # ---- admission ---------------------------------------------------------------------------
    def _admit(self) -> None:
        """Give pending prompts slots: a conversation whose last turn is parked in this session takes
        that slot as it is; any other prompt takes a free slot (spilling the longest-parked one if
        none is free), with the stored states its key or a shared opening has copied in once. What is
        left of the prompt is prefilled in the step's chunks. Identical prompts admitted together (a
        GRPO group's rollouts) are prefilled once and their states copied."""
        if not self.pending:
            return
        live = sum(r is not None for r in self.slots)
        if live >= self.max_rows:
            return
        self._reclaim()
        free = deque(self._free_slots())
        chat = self.chat
        if free:
            self._share_openings(free[0])
        budget = PREFILL_BUDGET - sum(len(r.prompt) - r.filled for r in self.slots if r is not None and r.twin is None)
        taken: list[tuple[Row, CachedPrefix | SlotPrefix | None]] = []
        first_of: dict[tuple, Row] = {}
        while self.pending and live + len(taken) < self.max_rows and budget > 0:
            row = self.pending.popleft()
            past, row.filled = chat.prefix_cache.reusable(row.key, row.prompt, row.adapter)
            own = chat.prefix_cache.pop(row.key) if row.key is not None else None  # this turn stores it again when it ends
            if isinstance(own, SlotPrefix) and own.cache is self.cache:
                row.slot = own.slot
                del self.parked[own.slot]
            elif free:
                row.slot = free.popleft()
            else:
                row.slot = self._spill_oldest()
            same = (tuple(row.prompt), row.adapter, id(past), row.filled)
            first = first_of.get(same)
            if first is not None and len(first.prompt) - first.filled <= PREFILL_BUDGET:
                row.twin = first
                chat.prefix_cache.hits += len(row.prompt)
            else:
                first_of[same] = row
                budget -= len(row.prompt) - row.filled
                chat.prefix_cache.hits += row.filled
            taken.append((row, past))
        last = max(row.slot for row, _ in taken)
        slots = last + 1
        if slots > self.cache.slots:  # grown for what is queued, and geometrically (each growth copies the cache)
            queued = live + len(taken) + len(self.parked) + len(self.pending)
            slots = max(slots, min(self.slot_space, max(queued, int(self.cache.slots * RowCache.GROWTH))))
        self.cache.reserve(slots, max(len(r.prompt) + r.limit for r, _ in taken))
        while len(self.slots) <= last:
            self.slots.append(None)
        for row, past in taken:
            slot = row.slot
            self.slots[slot] = row
            if row.twin is not None or past is None:
                self.cache.free(slot)
            elif isinstance(past, SlotPrefix) and past.cache is self.cache and past.slot == slot:
                self.cache.keep(slot, row.filled)  # in place: the columns the prompt still shares
            else:
                self._timed("copy_s", self.cache.put, slot, past.keys, past.values, row.filled)

    def _free_slots(self) -> list[int]:
        """Slots with neither a live row nor a parked turn, lowest first."""
        return [s for s in range(self.slot_space) if (s >= len(self.slots) or self.slots[s] is None) and s not in self.parked]

    def _reclaim(self) -> None:
        """Free the parked slots whose entry left the prefix cache (released, replaced or cleared)."""
        for slot, (key, entry) in list(self.parked.items()):
            if self.chat.prefix_cache.get(key) is not entry:
                del self.parked[slot]
                self.cache.free(slot)

    def _spill_oldest(self) -> int:
        """Copy the longest-parked slot's states out into the prefix cache; returns the slot, now free."""
        slot = next(iter(self.parked))
        key, entry = self.parked.pop(slot)
        keys, values = self._timed("copy_s", self.cache.states, slot)
        self.chat.prefix_cache.store(key, CachedPrefix(entry.ids, entry.adapter, keys, values))
        self.cache.free(slot)
        return slot

    def _share_openings(self, slot: int) -> None:
        """Prefill once (in free slot ``slot``, then kept as a shared prefix) the opening that several
        waiting new conversations share (same adapter, at least MIN_SHARED_PREFIX common leading
        tokens no stored state covers yet): each row then prefills only the rest of its prompt."""
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
            self.cache.reserve(slot + 1, length)
            self.cache.free(slot)
            for start in range(0, length, PREFILL_BUDGET):  # alone, chunk by chunk, before anything else runs
                count = min(PREFILL_BUDGET, length - start)
                ids = torch.tensor(head[start : start + count], dtype=torch.long, device=self.device)
                self._run([], [(slot, start, count)], ids, [adapter] * count, [])
            key = ("shared-opening", adapter, length)
            cache.store(key, CachedPrefix(head[:length], adapter, *self.cache.states(slot)))
            cache.share(key)
            self.cache.free(slot)

    # ---- sampling ----------------------------------------------------------------------------
    def _sample(self) -> list[int]:
        """Sample one token for each row whose prompt is in (its logits are ready); returns the
        slots whose row finished. The others decode their token in this step's forward."""
        chat, sampling = self.chat, self.sampling
        live = [s for s, r in enumerate(self.slots) if r is not None and r.filled == len(r.prompt)]
        if not live:
            return []
        clock = time.perf_counter()
        contiguous = live[-1] == len(live) - 1
        logits = self.logits[: len(live)] if contiguous else self.logits[torch.tensor(live, device=self.device)]
        rows = [self.slots[s] for s in live]
        streams = [r.generator for r in rows] if rows[0].generator is not None else self.generator
        if isinstance(streams, list) and any(g is None for g in streams):
            raise BackendError("rows with and without seeds cannot share a session; give every prompt a seed or none")
        tok, lp, ent = sample_next(logits, sampling, streams, compiled=chat.compiled_sampling)
        chat.timings["sample_s"] += time.perf_counter() - clock
        finished = []
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
                row.decoding = True
        return finished

    # ---- the packed forward ------------------------------------------------------------------
    def _forward(self) -> None:
        """One forward for the step: every decoding row's token, then prefill chunks (rows already
        in slots first, at most PREFILL_BUDGET tokens in all, a long prompt a chunk per step);
        twins get their first's states and logits once its prompt is in."""
        decode = [s for s, r in enumerate(self.slots) if r is not None and r.decoding]
        for s in decode:
            self.slots[s].decoding = False
        chunks, ids, adapters = [], [self._next_tokens[decode]], [self.slots[s].adapter for s in decode]
        budget = PREFILL_BUDGET
        for slot, row in enumerate(self.slots):
            if row is None or row.twin is not None or row.filled == len(row.prompt) or budget <= 0:
                continue
            count = min(budget, len(row.prompt) - row.filled)
            chunks.append((slot, row.filled, count))
            ids.append(torch.tensor(row.prompt[row.filled : row.filled + count], dtype=torch.long, device=self.device))
            adapters += [row.adapter] * count
            budget -= count
        if not decode and not chunks:
            return
        ends = [slot for slot, start, count in chunks if start + count == len(self.slots[slot].prompt)]
        logits = self._run(decode, chunks, torch.cat(ids), adapters, ends).float()  # sampled in float32 (a no-op in fp32)
        for slot, start, count in chunks:
            self.slots[slot].filled = start + count
        if self.logits is None:  # one row per possible slot, allocated once
            self.logits = torch.zeros(self.slot_space, logits.shape[-1], device=self.device)
        self.logits[decode] = logits[: len(decode)]
        for j, slot in enumerate(ends):
            self.logits[slot] = logits[len(decode) + j]
        for slot, row in enumerate(self.slots):  # twins whose first is now in
            if row is not None and row.twin is not None and row.twin.filled == len(row.twin.prompt):
                self._timed("copy_s", self.cache.copy, row.twin.slot, slot)
                self.logits[slot] = self.logits[row.twin.slot]
                row.filled, row.twin = len(row.prompt), None

    def _run(
        self, decode: list[int], chunks: list[tuple[int, int, int]], ids: torch.Tensor, adapters: list, ends: list[int]
    ) -> torch.Tensor:
        """The model over one packed step; returns the logits after each decoding token and after
        the last token of the chunks of the slots in ``ends``. Its time is split between prefill and
        decode by tokens."""
        chat = self.chat
        clock = time.perf_counter()
        positions = self.cache.begin_step(decode, chunks)
        keep, offset = list(range(len(decode))), len(decode)
        for slot, _, count in chunks:
            offset += count
            if slot in ends:
                keep.append(offset - 1)
        logits = chat.forward_step(
            self.cache, ids, positions, chat.adapter_names(adapters), torch.tensor(keep, dtype=torch.long, device=self.device)
        )
        self.cache.end_step()
        seconds = time.perf_counter() - clock
        prefilled = len(ids) - len(decode)
        chat.timings["decode_s"] += seconds * len(decode) / len(ids)
        chat.timings["prefill_s"] += seconds * prefilled / len(ids)
        chat.prefix_cache.misses += prefilled
        if decode:
            chat.steps_by_rows[len(decode)] += 1
            seen = int(positions[: len(decode)].sum()) + len(decode)  # a row sees its columns up to its new one
            chat.columns_by_rows[len(decode)] += seen
        return logits

    def _timed(self, phase: str, fn, *args):
        """``fn(*args)``, its wall time added to ``phase`` in the model's timings."""
        clock = time.perf_counter()
        result = fn(*args)
        self.chat.timings[phase] += time.perf_counter() - clock
        return result

    def _retire(self, slot: int) -> tuple[Any, Generation]:
        """A finished row leaves its slot: parked under its key with its states in place (the
        prompt and all but its last sampled token), or freed when it has no key."""
        row = self.slots[slot]
        self.slots[slot] = None
        if row.key is not None:
            n = int(self.cache.lengths[slot])
            ids = row.prompt + row.out[: n - len(row.prompt)]
            assert len(ids) == n, "cache columns and tokens disagree"
            entry = SlotPrefix(ids, row.adapter, self.cache, slot)
            self.chat.prefix_cache.store(row.key, entry)
            self.parked[slot] = (row.key, entry)
        else:
            self.cache.free(slot)
        return row.tag, self.chat.finish(row, self.sampling)

    def _compact(self) -> None:
        """With SDPA's decode attention (no compiled op), keep the live rows in the front slots while
        nothing waits to fill a free one: SDPA reads slots ``[0, highest decoding slot]``, so a free
        slot below the last live row costs its share of every step (the compiled op reads only the
        decoding rows' own slots, so there nothing moves). Parked slots stay where they are. Rows
        with their own seeds move the last live row into each hole (one row's states copied per
        hole); rows drawing from one shared stream keep their order (the stream's numbers go to
        rows in slot order), so the rows after a hole shift down."""
        while self.slots and self.slots[-1] is None:
            self.slots.pop()
        if self.cache.rows_attention is not None or self.pending or all(r is not None for r in self.slots):
            return
        live = [s for s, r in enumerate(self.slots) if r is not None]
        targets = [s for s in range(len(self.slots)) if s not in self.parked][: len(live)]
        if self.slots[live[0]].generator is not None:
            holes = [t for t in targets if self.slots[t] is None]
            outside = [s for s in reversed(live) if s > targets[-1]]
            moves = list(zip(outside, holes))
        else:
            moves = [(source, target) for target, source in zip(targets, live) if source != target]
        for source, target in moves:
            self._timed("copy_s", self.cache.move, source, target)
            self.slots[target], self.slots[source] = self.slots[source], None
            self.slots[target].slot = target
            self._next_tokens[target] = self._next_tokens[source]
        while self.slots and self.slots[-1] is None:
            self.slots.pop()
