"""A transformers causal LM as a batched, token-in-token-out chat model.

Why a hand-written decode loop instead of ``model.generate``: the learner must score exactly the
sampled ids under exactly the distribution they were sampled from (DESIGN.md's log-prob
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
from collections.abc import Sequence
from pathlib import Path

import torch

from scope_marl.backends.base import (
    BackendError,
    Generation,
    SamplingParams,
    check_adapters,
    cut_at_stop,
)
from scope_marl.types import Message

BASE_ADAPTER = "__base__"  # peft's name for "no adapter" inside a mixed batch


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


def sample_next(
    logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample one token per row. Returns (ids, log-probs, entropies) per DESIGN.md's definition."""
    greedy = sampling.temperature == 0.0
    logp = torch.log_softmax(logits.float() / (1.0 if greedy else sampling.temperature), dim=-1)
    probs = logp.exp()
    entropy = -(probs * logp).sum(-1)
    if greedy:
        ids = logp.argmax(-1)
    else:
        if sampling.top_p < 1.0:
            # Nucleus: keep the smallest prefix of the sorted distribution whose mass reaches top_p
            # (the top token always survives). Only sampling is truncated; log-probs stay full.
            sorted_p, order = probs.sort(-1, descending=True)
            drop = (sorted_p.cumsum(-1) - sorted_p) >= sampling.top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        ids = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return ids, logp.gather(-1, ids[:, None]).squeeze(-1), entropy


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


class HFChatModel:
    """A transformers causal LM (optionally with peft LoRA adapters) behind the ChatModel protocol."""

    def __init__(
        self,
        model,
        tokenizer,
        name: str = "hf",
        default_system_prompt: str | None = None,
        max_batch_size: int = 64,
    ):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.default_system_prompt = default_system_prompt
        self.max_batch_size = max_batch_size
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.stop_ids = self._end_of_turn_ids(tokenizer)

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

    @staticmethod
    def _end_of_turn_ids(tokenizer) -> set[int]:
        ids = {tokenizer.eos_token_id}
        for tok in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
            tid = tokenizer.convert_tokens_to_ids(tok)
            if isinstance(tid, int) and tid != tokenizer.unk_token_id:
                ids.add(tid)
        return {i for i in ids if i is not None}

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

    # ---- prompts -------------------------------------------------------------------------------
    def encode_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of a chat prompt via the tokenizer's chat template.

        A missing system message is filled with ``default_system_prompt`` (when set) so that no
        template-injected default (SmolLM2 names itself otherwise) leaks into a role's context.
        """
        chat = [{"role": m.role, "content": m.content} for m in messages]
        if self.default_system_prompt is not None and (not chat or chat[0]["role"] != "system"):
            chat.insert(0, {"role": "system", "content": self.default_system_prompt})
        text = self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=add_generation_prompt)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def generate(
        self,
        prompts: Sequence[Sequence[Message]],
        sampling: SamplingParams,
        adapters: Sequence[str | None] | None = None,
    ) -> list[Generation]:
        return self.generate_ids([self.encode_chat(p) for p in prompts], sampling, adapters)

    # ---- decoding ------------------------------------------------------------------------------
    def generate_ids(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams,
        adapters: Sequence[str | None] | None = None,
    ) -> list[Generation]:
        """Generate from token ids. Batches of similar length run together; order is preserved."""
        adapters = check_adapters(adapters, len(prompt_ids), self.adapters)
        if any(len(p) == 0 for p in prompt_ids):
            raise BackendError("empty prompt: every prompt needs at least one token")
        generator = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
        order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
        results: list[Generation | None] = [None] * len(prompt_ids)
        for start in range(0, len(order), self.max_batch_size):
            chunk = order[start : start + self.max_batch_size]
            outs = self._decode_batch([list(prompt_ids[i]) for i in chunk], [adapters[i] for i in chunk], sampling, generator)
            for i, out in zip(chunk, outs):
                results[i] = out
        return results  # type: ignore[return-value]

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
    def _decode_batch(
        self,
        prompts: list[list[int]],
        adapters: list[str | None],
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> list[Generation]:
        cfg = self.model.config
        device = next(self.model.parameters()).device
        batch, width = len(prompts), max(len(p) for p in prompts)
        context = getattr(cfg, "max_position_embeddings", None) or 1 << 30
        max_new = min(sampling.max_new_tokens, context - width)
        if max_new < 1:
            raise BackendError(
                f"prompt of {width} tokens leaves no room in the model's {context}-token context; "
                "shorten the conversation or lower the number of turns"
            )
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        cache = SlotCache(cfg.num_hidden_layers, batch, kv_heads, head_dim, width + max_new, torch.float32, device)

        lengths = torch.tensor([len(p) for p in prompts], device=device)
        ids = torch.full((batch, width), self.pad_id, dtype=torch.long, device=device)
        for row, p in enumerate(prompts):
            ids[row, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        valid = torch.zeros(batch, width + max_new, dtype=torch.bool, device=device)
        cols = torch.arange(width, device=device)
        valid[:, :width] = cols[None, :] >= (width - lengths)[:, None]
        positions = (valid[:, :width].long().cumsum(-1) - 1).clamp(min=0)
        use_peft = bool(self.adapters)
        names = [a if a is not None else BASE_ADAPTER for a in adapters] if use_peft else None

        logits = self._forward(cache, ids, positions, attention_mask_4d(valid[:, :width], cols), names)

        live = torch.arange(batch, device=device)  # original row of each row still in the batch
        out_ids: list[list[int]] = [[] for _ in range(batch)]
        out_lp: list[list[float]] = [[] for _ in range(batch)]
        out_ent: list[list[float]] = [[] for _ in range(batch)]
        finish = ["length"] * batch
        for step in range(max_new):
            tok, lp, ent = sample_next(logits, sampling, generator)
            done_rows = []
            for j, (row, t, l, e) in enumerate(zip(live.tolist(), tok.tolist(), lp.tolist(), ent.tolist())):
                out_ids[row].append(t)
                out_lp[row].append(l)
                out_ent[row].append(e)
                if t in self.stop_ids or (sampling.stop and self._hit_stop(out_ids[row], sampling.stop)):
                    finish[row] = "stop"
                    done_rows.append(j)
            if step == max_new - 1:
                break
            if done_rows:
                finished = set(done_rows)
                keep = torch.tensor([j for j in range(len(live)) if j not in finished], device=device)
                if len(keep) == 0:
                    break
                live, tok, valid, lengths = live[keep], tok[keep], valid[keep], lengths[keep]
                cache.keep_rows(keep)
                if names is not None:
                    names = [names[j] for j in keep.tolist()]
            col = width + step
            valid[:, col] = True
            step_positions = (lengths + step)[:, None]
            mask = valid[:, None, None, : col + 1]
            logits = self._forward(cache, tok[:, None], step_positions, mask, names)

        return [self._finish(p, i, l, e, f, sampling) for p, i, l, e, f in zip(prompts, out_ids, out_lp, out_ent, finish)]

    def _hit_stop(self, ids: list[int], stop: list[str]) -> bool:
        # Only the tail can contain a newly completed stop string; decode enough of it.
        tail = self.tokenizer.decode(ids[-(max(len(s) for s in stop) + 8) :], skip_special_tokens=True)
        return cut_at_stop(tail, stop)[1]

    def _finish(self, prompt, ids, logprobs, entropies, finish, sampling) -> Generation:
        body = ids[:-1] if ids and ids[-1] in self.stop_ids else ids
        text, _ = cut_at_stop(self.tokenizer.decode(body, skip_special_tokens=True), sampling.stop)
        return Generation(
            text=text.strip(),
            token_ids=ids,
            logprobs=logprobs,
            entropies=entropies,
            finish_reason=finish,
            prompt_ids=prompt,
        )
