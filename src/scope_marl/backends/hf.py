"""A transformers causal LM as a batched, token-in-token-out chat model.

Why a hand-written decode loop instead of ``model.generate``: the learner must score exactly the
sampled ids under exactly the distribution they were sampled from (docs/interfaces.md's log-prob
definition), and a rollout engine needs many sequences of different lengths decoded together with
few Python calls per token. The loop below keeps one preallocated KV cache per batch
(:class:`SlotCache`), left-pads prompts, passes an explicit 4-D attention mask and position ids,
samples with temperature / top-p, records the log-prob and entropy of the temperature-scaled full
distribution, and drops finished rows from the batch as it goes.

LoRA: several peft adapters live on one base; each prompt names its adapter (``None`` = base with
adapters disabled) and a mixed batch runs in one forward pass through peft's ``adapter_names``.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch

from scope_marl.backends.base import (
    BackendError,
    ContextLengthError,
    FinishReason,
    Generation,
    SamplingParams,
    check_adapters,
    cut_at_stop,
)
from scope_marl.backends.chat_tokens import ChatTokens
from scope_marl.backends.prefix_cache import CachedPrefix, PrefixCache, common_prefix
from scope_marl.core.seeds import scrambled

BASE_ADAPTER = "__base__"  # peft's name for "no adapter" inside a mixed batch
# New conversations whose prompts share at least this many leading tokens get that opening
# prefilled once and kept as a shared prefix (tau2's 5,100-token agent prompt, a long system prompt).
MIN_SHARED_PREFIX = 256

# peft 0.21 reads transformers' deprecated `is_gradient_checkpointing` whenever it wraps a model;
# the warning is about peft's code, not ours or the user's, and would print on every run.
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)


class SlotCache:
    """Preallocated KV cache shared by a batch; all rows write the same column range.

    Implements the two methods transformers' attention layers call (``update`` and
    ``get_seq_length``). ``update`` returns views up to the current length, so attention never
    touches the unused tail of the buffer and nothing is re-concatenated per token.
    """

    def __init__(self, num_layers: int, batch: int, kv_heads: int, head_dim: int, max_len: int, dtype, device):
        shape = (batch, kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.length = 0  # columns written so far, advanced by ``advance`` after each forward
        self.max_len = max_len

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        end = self.length + key_states.shape[-2]
        self.keys[layer_idx][:, :, self.length : end] = key_states
        self.values[layer_idx][:, :, self.length : end] = value_states
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def advance(self, n: int) -> None:
        self.length += n

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Drop finished sequences so later steps compute only live ones."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]


NUCLEUS_CANDIDATES = 256  # top-p looks at this many best tokens first; a full sort only if they fall short


def sample_next(
    logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | Sequence[torch.Generator] | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample one token per row. Returns (ids, log-probs, entropies) per the log-prob definition in docs/interfaces.md.

    ``generator`` is one stream for the whole batch, or one per row (per-episode seeds: a row's draws
    then do not depend on its neighbours). Each row uses exactly one uniform number per token.
    """
    greedy = sampling.temperature == 0.0
    logp = torch.log_softmax(logits.float() / (1.0 if greedy else sampling.temperature), dim=-1)
    probs = logp.exp()
    entropy = -(probs * logp).sum(-1)
    if greedy:
        ids = logp.argmax(-1)
    else:
        if isinstance(generator, Sequence):
            u = torch.cat([torch.rand(1, generator=g) for g in generator])
        else:
            u = torch.rand(probs.shape[0], generator=generator)
        if sampling.top_p < 1.0:
            ids = _sample_nucleus(probs, sampling.top_p, u)
        else:
            ids = _sample_inverse_cdf(probs, torch.arange(probs.shape[-1]).expand_as(probs), u)
    return ids, logp.gather(-1, ids[:, None]).squeeze(-1), entropy


def _sample_inverse_cdf(weights: torch.Tensor, token_ids: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Draw one column per row in proportion to ``weights`` (unnormalized), row i at uniform ``u[i]``.

    One uniform number per row and a binary search over the running sum: ``torch.multinomial``
    draws an exponential variate per vocabulary entry, which costs more than the LM head here.
    """
    cdf = weights.cumsum(-1)
    col = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True).clamp(max=weights.shape[-1] - 1)
    return token_ids.gather(-1, col).squeeze(-1)


def _sample_nucleus(probs: torch.Tensor, top_p: float, u: torch.Tensor) -> torch.Tensor:
    """Top-p: keep the smallest set of most likely tokens whose mass reaches ``top_p`` (the top token always).

    The nucleus is almost always inside the few hundred best tokens, so ``topk`` replaces a full
    vocabulary sort; rows whose candidates do not reach ``top_p`` get the exact full sort (with the
    same uniform number).
    """
    k = min(NUCLEUS_CANDIDATES, probs.shape[-1])
    best, order = probs.topk(k, dim=-1)
    ids = _sample_inverse_cdf(best * ((best.cumsum(-1) - best) < top_p), order, u)
    short = (best.sum(-1) < top_p).nonzero().squeeze(-1)
    if len(short) and k < probs.shape[-1]:
        best, order = probs[short].sort(-1, descending=True)
        ids[short] = _sample_inverse_cdf(best * ((best.cumsum(-1) - best) < top_p), order, u[short])
    return ids


def attention_mask_4d(valid: torch.Tensor, query_cols: torch.Tensor) -> torch.Tensor:
    """Boolean mask [B, 1, Q, K]: a query attends to valid keys at or before its own column.

    ``valid`` [B, K] marks real (non-padding) key columns. Padding queries are also allowed to see
    their own column so that no row is fully masked (a fully masked row makes SDPA return NaN,
    which would then poison the cache through 0 * NaN).
    """
    keys = torch.arange(valid.shape[1], device=valid.device)
    causal = keys[None, :] <= query_cols[:, None]  # [Q, K]
    own = keys[None, :] == query_cols[:, None]
    return ((valid[:, None, :] & causal[None]) | own[None])[:, None]


class HFChatModel(ChatTokens):
    """A transformers causal LM (optionally with peft LoRA adapters) behind the ChatModel protocol."""

    def __init__(
        self,
        model,
        tokenizer,
        name: str = "hf",
        default_system_prompt: str | None = None,
        max_batch_size: int = 64,
    ):
        super().__init__(tokenizer, default_system_prompt)
        self.model = model.eval()
        self.name = name
        self.max_batch_size = max_batch_size
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.prefix_cache = PrefixCache()
        # Wall time by phase, for benchmarks and profiling ("where does the time go").
        self.timings = {"prefill_s": 0.0, "decode_s": 0.0, "sample_s": 0.0, "decode_steps": 0, "decode_rows": 0}

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, name: str | None = None, device: str = "cpu", **kwargs):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a second-long load needs no progress bar
        path = Path(path)
        if not (path / "config.json").exists():
            raise BackendError(
                f"no transformers model at {path} (config.json missing); pass a directory written by "
                "save_pretrained, or use --model embedded for the bundled SmolLM2-135M-Instruct"
            )
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
        return cls(model, tokenizer, name=name or f"hf:{path}", **kwargs)

    # ---- LoRA adapters -------------------------------------------------------------------------
    @property
    def adapters(self) -> list[str]:
        return list(getattr(self.model, "peft_config", {}) or {})

    def add_adapter(self, name: str, source) -> None:
        """Add a LoRA adapter: ``source`` is a saved adapter directory or a ``peft.LoraConfig``."""
        from peft import PeftModel, get_peft_model

        if name in self.adapters or name == BASE_ADAPTER:
            raise BackendError(f"adapter name {name!r} is already taken; choose another name")
        is_peft = isinstance(self.model, PeftModel)
        if isinstance(source, (str, os.PathLike)):
            if is_peft:
                self.model.load_adapter(str(source), adapter_name=name)
            else:
                self.model = PeftModel.from_pretrained(self.model, str(source), adapter_name=name)
        elif is_peft:
            self.model.add_adapter(name, source)
        else:
            self.model = get_peft_model(self.model, source, adapter_name=name)
        self.model.eval()

    def remove_adapter(self, name: str) -> None:
        """Drop adapter ``name`` (an evicted pool member; names are never reused, so cached states need no purge)."""
        self.model.delete_adapter(name)

    def load_adapter_weights(self, name: str, folder: str | os.PathLike) -> None:
        """Overwrite adapter ``name``'s weights with those saved in ``folder`` (peft layout)."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(self.model, load_file(str(Path(folder) / "adapter_model.safetensors")), adapter_name=name)
        self.prefix_cache.clear()

    def adapter_tensors(self, name: str) -> dict:
        """Adapter ``name``'s weights as a peft state dict (detached copies): what a Ray worker is sent."""
        from peft import get_peft_model_state_dict

        if name not in self.adapters:
            raise BackendError(f"unknown LoRA adapter {name!r}; this backend holds {sorted(self.adapters) or 'none'}")
        return {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model, adapter_name=name).items()}

    def set_adapter_tensors(self, name: str, tensors: dict) -> None:
        """Overwrite adapter ``name``'s weights with a peft state dict held in memory (a Ray worker's update)."""
        from peft import set_peft_model_state_dict

        if name not in self.adapters:
            raise BackendError(f"unknown LoRA adapter {name!r}; this backend holds {sorted(self.adapters) or 'none'}")
        set_peft_model_state_dict(self.model, tensors, adapter_name=name)
        self.prefix_cache.clear()  # cached states were computed with the old weights

    def load_weights(self, path: str | os.PathLike) -> None:
        """Overwrite every weight from a safetensors file written by ``safetensors.torch.save_model``
        (a fully fine-tuned policy)."""
        from safetensors.torch import load_model

        load_model(self.model, str(path))
        self.prefix_cache.clear()

    # ---- decoding ------------------------------------------------------------------------------
    def generate_ids(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams,
        adapters: Sequence[str | None] | None = None,
        cache_keys: Sequence[Hashable | None] | None = None,
        seeds: Sequence[int] | None = None,
        on_token: Callable[[int, int], None] | None = None,
    ) -> list[Generation]:
        """Generate from token ids. Batches of similar length run together; order is preserved.

        ``on_token(i, token_id)`` is called for every sampled token of prompt ``i`` as soon as it is
        sampled (a server streams replies from it); the returned generations are the same either way.

        ``seeds``: one random stream per prompt, so a row samples the same tokens whichever rows
        share its batch (its logits can still differ in the last bits with the batch's shape).

        ``cache_keys`` names the conversation each prompt continues: the key/value states of an
        earlier prompt with the same key (and adapter) are reused for the shared prefix, and the
        states of this prompt plus its reply are stored under the key for the next turn. Call
        :meth:`release` when a conversation ends.
        """
        n = len(prompt_ids)
        adapters = check_adapters(adapters, n, self.adapters)
        keys = list(cache_keys) if cache_keys is not None else [None] * n
        if len(keys) != n:
            raise BackendError(f"got {len(keys)} cache keys for {n} prompts; pass one per prompt or None")
        if any(len(p) == 0 for p in prompt_ids):
            raise BackendError("empty prompt: every prompt needs at least one token")
        too_long = [i for i, p in enumerate(prompt_ids) if len(p) >= self.context_length]
        if too_long:
            raise ContextLengthError(
                f"prompt(s) {too_long} fill the model's {self.context_length}-token context; "
                "shorten the conversation (fewer turns, shorter system prompts)"
            )
        if seeds is not None and len(seeds) != n:
            raise BackendError(f"got {len(seeds)} seeds for {n} prompts; pass one per prompt or None")
        generator = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
        self._share_openings(prompt_ids, adapters, keys)
        order = sorted(range(n), key=lambda i: len(prompt_ids[i]))
        results: list[Generation | None] = [None] * n
        for start in range(0, n, self.max_batch_size):
            chunk = order[start : start + self.max_batch_size]
            rows = [_Row(list(prompt_ids[i]), adapters[i], keys[i]) for i in chunk]
            if seeds is not None:
                for i, row in zip(chunk, rows):
                    row.generator = torch.Generator().manual_seed(scrambled(seeds[i]))
            if on_token is not None:
                for i, row in zip(chunk, rows):
                    row.on_token = partial(on_token, i)
            for i, out in zip(chunk, self._decode_batch(rows, sampling, generator)):
                results[i] = out
        return results  # type: ignore[return-value]

    def _share_openings(self, prompts: Sequence[Sequence[int]], adapters: Sequence[str | None], keys: Sequence[Hashable | None]) -> None:
        """Prefill once the opening that several new conversations of this call share (same adapter,
        at least MIN_SHARED_PREFIX common leading tokens no stored state covers yet), and keep it
        shared: each row then prefills only the rest of its prompt."""
        fresh: dict[tuple, list[int]] = {}
        for i, prompt in enumerate(prompts):
            if len(prompt) <= MIN_SHARED_PREFIX:
                continue
            _, covered = self.prefix_cache.reusable(keys[i], list(prompt), adapters[i])
            if covered < MIN_SHARED_PREFIX:
                fresh.setdefault((adapters[i], tuple(prompt[:MIN_SHARED_PREFIX])), []).append(i)
        for (adapter, _), members in fresh.items():
            if len(members) < 2:
                continue
            head = [int(t) for t in prompts[members[0]]]
            ids = np.asarray(head)
            length = min(common_prefix(ids, list(prompts[i]), len(prompts[i]) - 1) for i in members)
            key = ("shared-opening", adapter, length)
            self._decode_batch([_Row(head[:length], adapter, key)], SamplingParams(temperature=0.0, max_new_tokens=1), None)
            self.prefix_cache.share(key)

    def release(self, cache_keys: Iterable[Hashable]) -> None:
        """Free the stored states of conversations that ended."""
        self.prefix_cache.release(cache_keys)

    @property
    def context_length(self) -> int:
        return getattr(self.model.config, "max_position_embeddings", None) or 1 << 30

    def _forward(self, cache: SlotCache, ids, positions, mask, adapter_names):
        kwargs = {"adapter_names": adapter_names} if adapter_names is not None else {}
        out = self.model(
            input_ids=ids,
            position_ids=positions,
            attention_mask=mask,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
            **kwargs,
        )
        cache.advance(ids.shape[1])
        return out.logits[:, -1, :]

    @torch.inference_mode()
    def _decode_batch(self, rows: list[_Row], sampling: SamplingParams, generator) -> list[Generation]:
        """Prefill every row's uncached tokens together, then decode one token per row per step.

        Cache columns: [0, P) reused prefixes (right-aligned), [P, P+N) the new prompt tokens
        (right-aligned), then one column per decoding step. ``valid`` marks the real columns of
        each row; positions count only real tokens, so padding changes no number.
        """
        cfg = self.model.config
        device = next(self.model.parameters()).device
        for row in rows:
            row.past, row.reused = self.prefix_cache.reusable(row.key, row.prompt, row.adapter)
        batch = len(rows)
        reused = torch.tensor([r.reused for r in rows], device=device)
        lengths = torch.tensor([len(r.prompt) for r in rows], device=device)
        fresh = lengths - reused
        past_w, new_w = int(reused.max()), int(fresh.max())
        limits = [min(sampling.max_new_tokens, self.context_length - len(r.prompt)) for r in rows]
        max_new = max(limits)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        total = past_w + new_w + max_new
        cache = SlotCache(cfg.num_hidden_layers, batch, kv_heads, head_dim, total, torch.float32, device)

        cols = torch.arange(total, device=device)
        valid = (cols[None, :] >= past_w - reused[:, None]) & (cols[None, :] < past_w)
        valid |= (cols[None, :] >= past_w + new_w - fresh[:, None]) & (cols[None, :] < past_w + new_w)
        ids = torch.full((batch, new_w), self.pad_id, dtype=torch.long, device=device)
        for j, row in enumerate(rows):
            ids[j, new_w - len(row.prompt) + row.reused :] = torch.tensor(row.prompt[row.reused :], dtype=torch.long)
            if row.past is not None:
                for layer in range(cfg.num_hidden_layers):
                    cache.keys[layer][j, :, past_w - row.reused : past_w] = row.past.keys[layer][:, : row.reused]
                    cache.values[layer][j, :, past_w - row.reused : past_w] = row.past.values[layer][:, : row.reused]
        self.prefix_cache.hits += int(reused.sum())
        self.prefix_cache.misses += int(fresh.sum())
        cache.advance(past_w)
        positions = (reused[:, None] + torch.arange(new_w, device=device)[None, :] - (new_w - fresh)[:, None]).clamp(min=0)
        names = self._adapter_names(rows)
        query_cols = cols[past_w : past_w + new_w]
        clock = time.perf_counter()
        logits = self._forward(cache, ids, positions, attention_mask_4d(valid[:, : past_w + new_w], query_cols), names)
        self.timings["prefill_s"] += time.perf_counter() - clock

        live = list(range(batch))  # which row each batch position holds
        for step in range(max_new):
            clock = time.perf_counter()
            streams = [rows[r].generator for r in live] if rows[0].generator is not None else generator
            tok, lp, ent = sample_next(logits, sampling, streams)
            self.timings["sample_s"] += time.perf_counter() - clock
            finished = []
            for j, (t, logprob, e) in enumerate(zip(tok.tolist(), lp.tolist(), ent.tolist())):
                row = rows[live[j]]
                row.out.append(t)
                row.logprobs.append(logprob)
                row.entropies.append(e)
                if row.on_token is not None:
                    row.on_token(t)
                if t in self.stop_ids or (sampling.stop and self._hit_stop(row.out, sampling.stop)):
                    row.finish = "stop"
                    finished.append(j)
                elif len(row.out) >= limits[live[j]]:
                    finished.append(j)
            if len(finished) == len(live):
                break
            for j in finished:
                self._keep_prefix(rows[live[j]], cache, valid[j], j)
            if finished:
                keep = [j for j in range(len(live)) if j not in set(finished)]
                index = torch.tensor(keep, device=device)
                live = [live[j] for j in keep]
                tok, valid, lengths = tok[index], valid[index], lengths[index]
                cache.keep_rows(index)
                if names is not None:
                    names = [names[j] for j in keep]
            col = cache.length
            valid[:, col] = True
            clock = time.perf_counter()
            logits = self._forward(cache, tok[:, None], (lengths + step)[:, None], valid[:, None, None, : col + 1], names)
            self.timings["decode_s"] += time.perf_counter() - clock
            self.timings["decode_steps"] += 1
            self.timings["decode_rows"] += len(live)
        for j, r in enumerate(live):
            self._keep_prefix(rows[r], cache, valid[j], j)
        return [self._finish(row, sampling) for row in rows]

    def _adapter_names(self, rows: list[_Row]) -> list[str] | None:
        if not self.adapters:
            return None
        return [r.adapter if r.adapter is not None else BASE_ADAPTER for r in rows]

    def _keep_prefix(self, row: _Row, cache: SlotCache, valid: torch.Tensor, j: int) -> None:
        """Store the states this row computed (prompt + all but its last sampled token) under its key."""
        if row.key is None:
            return
        columns = valid[: cache.length].nonzero().squeeze(-1)
        ids = row.prompt + row.out[: len(columns) - len(row.prompt)]
        assert len(ids) == len(columns), "cache columns and tokens disagree"
        self.prefix_cache.store(
            row.key,
            CachedPrefix(
                ids=ids,
                adapter=row.adapter,
                keys=[k[j].index_select(1, columns) for k in cache.keys],
                values=[v[j].index_select(1, columns) for v in cache.values],
            ),
        )

    def _hit_stop(self, ids: list[int], stop: list[str]) -> bool:
        # Only the tail can contain a newly completed stop string; decode enough of it.
        tail = self.tokenizer.decode(ids[-(max(len(s) for s in stop) + 8) :], skip_special_tokens=True)
        return cut_at_stop(tail, stop)[1]

    def _finish(self, row: _Row, sampling: SamplingParams) -> Generation:
        body = row.out[:-1] if row.out and row.out[-1] in self.stop_ids else row.out
        # Exact decode, special tokens kept: the transcript must say what the stream holds.
        text, _ = cut_at_stop(self.decode(body), sampling.stop)
        return Generation(
            text=text,
            token_ids=row.out,
            logprobs=row.logprobs,
            entropies=row.entropies,
            finish_reason=row.finish,
            prompt_ids=row.prompt,
        )


@dataclass
class _Row:
    """One prompt's decoding state inside a batch."""

    prompt: list[int]
    adapter: str | None
    key: Hashable | None
    past: CachedPrefix | None = None
    reused: int = 0
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    finish: FinishReason = "length"
    generator: torch.Generator | None = None  # the row's own random stream (per-episode seeds)
    on_token: Callable[[int], None] | None = None  # told each sampled id as it is sampled (streaming)
