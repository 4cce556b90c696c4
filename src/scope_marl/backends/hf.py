"""A transformers causal LM as a batched, token-in-token-out chat model.

Why a hand-written decode loop instead of ``model.generate``: the learner must score exactly the
sampled ids under exactly the distribution they were sampled from (docs/interfaces.md's log-prob
definition), and a rollout engine needs many sequences of different lengths decoded together with
few Python calls per token. Decoding runs in a :class:`~scope_marl.backends.decode_session.DecodeSession`
(continuous batching: each row is admitted and retired on its own, its KV states in one slot of a
preallocated cache), with an explicit 4-D attention mask and position ids; sampling
(``backends.sampling``) records the log-prob and entropy of the temperature-scaled full distribution.

LoRA: several peft adapters live on one base; each prompt names its adapter (``None`` = base with
adapters disabled) and a mixed batch runs in one forward pass through peft's ``adapter_names``.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from functools import partial
from pathlib import Path

import torch

import scope_marl.backends.base as base
from scope_marl.backends.base import (
    BackendError,
    ContextLengthError,
    Generation,
    SamplingParams,
    check_adapters,
    cut_at_stop,
)
from scope_marl.backends.chat_tokens import ChatTokens
from scope_marl.backends.decode_session import DecodeSession, Row
from scope_marl.backends.packed_linear import PackedModules, PackedWeights, packing_available
from scope_marl.backends.prefix_cache import PrefixCache

BASE_ADAPTER = "__base__"  # peft's name for "no adapter" inside a mixed batch


def _keep_rows(out, keep: torch.Tensor):
    """The body's output cut to the rows in ``keep`` (a forward hook: the LM head then sees only those)."""
    out.last_hidden_state = out.last_hidden_state[keep]
    return out


# peft 0.21 reads transformers' deprecated `is_gradient_checkpointing` whenever it wraps a model;
# the warning is about peft's code, not ours or the user's, and would print on every run.
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)


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
        from scope_marl.backends.attention import use_sdpa_gqa

        super().__init__(tokenizer, default_system_prompt)
        use_sdpa_gqa(model)
        self.model = model.eval()
        self.name = name
        self.max_batch_size = max_batch_size
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.prefix_cache = PrefixCache()
        # Wall time by phase, for benchmarks and profiling ("where does the time go").
        self.timings = {"prefill_s": 0.0, "decode_s": 0.0, "sample_s": 0.0, "copy_s": 0.0}
        # Decode steps by live rows: the step count, the rows decoded and each step's batch (a roofline needs it).
        self.steps_by_rows: Counter[int] = Counter()
        # ... and the cache columns those steps' rows attended over, summed (a roofline's KV bytes).
        self.columns_by_rows: Counter[int] = Counter()
        self.packed = PackedWeights() if packing_available() else None  # decoding's pre-packed weights
        # The routing of this model's linears to them, kept with the model, weights and adapters it was found for.
        self._packed_modules: tuple | None = None
        # Decode attention through the compiled op (backends.rows_attention) where it builds; False: torch's SDPA.
        self.compiled_attention = True
        # Decode sampling through the compiled op (backends.sampling) where it builds; False: torch's ops.
        self.compiled_sampling = True

    def __getstate__(self) -> dict:
        return {**self.__dict__, "packed": None, "_packed_modules": None}  # packed copies are remade where they are used

    def __setstate__(self, state: dict) -> None:
        """Unpickled in another process (a Ray or data-parallel worker): its attention function
        must be registered there too."""
        from scope_marl.backends.attention import use_sdpa_gqa

        self.__dict__.update(state)
        self.packed = PackedWeights() if packing_available() else None
        use_sdpa_gqa(self.model)

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, name: str | None = None, placement=None, **kwargs):
        """A model directory (``save_pretrained`` layout) loaded onto ``placement``'s device in its dtype
        (default: the CPU in float32)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        from scope_marl.backends.placement import CPU

        hf_logging.disable_progress_bar()  # a second-long load needs no progress bar
        path = Path(path)
        if not (path / "config.json").exists():
            raise BackendError(
                f"no transformers model at {path} (config.json missing); pass a directory written by "
                "save_pretrained, or use --model embedded for the bundled SmolLM2-135M-Instruct"
            )
        tokenizer = AutoTokenizer.from_pretrained(path)
        placement = placement or CPU
        model = AutoModelForCausalLM.from_pretrained(path, dtype=placement.dtype, device_map=None).to(placement.device)
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
        # Master weights: an adapter trains in float32 whatever the base's dtype (peft casts each layer's
        # input to the adapter's dtype and its output back), so its optimizer state is float32 too.
        for parameter_name, parameter in self.model.named_parameters():
            if "lora_" in parameter_name and f".{name}." in parameter_name and parameter.dtype != torch.float32:
                parameter.data = parameter.data.float()
        self.model.eval()
        self._packed_modules = None  # new LoRA linears: the decode routing is found again

    def remove_adapter(self, name: str) -> None:
        """Drop adapter ``name`` (an evicted pool member, or the lab's agent before a fresh one of the same name)."""
        self.model.delete_adapter(name)
        self.prefix_cache.forget_adapter(name)
        # The routing held the deleted LoRA linears; kept, it would leave the next adapter of this name on torch's
        # path (a last-bits difference from a fresh process's run) and keep the deleted weights alive.
        self._packed_modules = None

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
    def open_session(self, sampling: SamplingParams, generator: torch.Generator | None = None) -> DecodeSession:
        """A continuous-batching session (``backends.decode_session``): prompts added at any time,
        generations handed back as each finishes. The rollout engine keeps one per model and sampling."""
        return DecodeSession(self, sampling, generator)

    def generate_ids(
        self,
        prompt_ids: base.PromptIds,
        sampling: SamplingParams,
        adapters: base.Adapters = None,
        cache_keys: base.CacheKeys = None,
        seeds: base.Seeds = None,
        on_token: Callable[[int, int], None] | None = None,
    ) -> list[Generation]:
        """Generate from token ids; order is preserved. The prompts share one continuous batch of at
        most ``max_batch_size`` rows (shortest first): a finished row's slot takes the next prompt.

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
        too_long = [i for i, p in enumerate(prompt_ids) if len(p) >= self.context_length]
        if too_long:
            raise ContextLengthError(
                f"prompt(s) {too_long} fill the model's {self.context_length}-token context; "
                "shorten the conversation (fewer turns, shorter system prompts)"
            )
        if seeds is not None and len(seeds) != n:
            raise BackendError(f"got {len(seeds)} seeds for {n} prompts; pass one per prompt or None")
        generator = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
        session = self.open_session(sampling, generator)
        for i in sorted(range(n), key=lambda i: len(prompt_ids[i])):
            seed = seeds[i] if seeds is not None else None
            session.add(list(prompt_ids[i]), adapters[i], keys[i], seed, partial(on_token, i) if on_token else None, tag=i)
        results: list[Generation | None] = [None] * n
        try:
            while session.busy:
                for i, generation in session.step():
                    results[i] = generation
        finally:
            session.close()  # the states of keyed turns outlive this call's session (copied out once)
        return results  # type: ignore[return-value]

    def release(self, cache_keys: Iterable[Hashable]) -> None:
        """Free the stored states of conversations that ended."""
        self.prefix_cache.release(cache_keys)

    @property
    def device(self) -> torch.device:
        """Where the model's weights are (every tensor made for it is made there)."""
        return self.model.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The base weights' dtype (LoRA adapters stay float32 under a bfloat16 base), which the KV cache takes."""
        return self.model.get_input_embeddings().weight.dtype

    @property
    def context_length(self) -> int:
        return getattr(self.model.config, "max_position_embeddings", None) or 1 << 30

    def forward_step(self, cache, ids: torch.Tensor, positions: torch.Tensor, adapter_names, keep: torch.Tensor) -> torch.Tensor:
        """One packed step through ``cache`` (a ``RowCache`` laid out by ``begin_step``): token ``i`` is
        ``ids[i]`` at ``positions[i]``. Returns the next-token logits after the tokens ``keep``.

        Each token is its own batch row of length 1, so peft's per-row adapters apply per token and
        every layer but attention (the cache's own, ``kv_slots``) runs on all tokens at once; only
        the kept tokens' hidden states reach the LM head."""
        kwargs = {"adapter_names": adapter_names} if adapter_names is not None else {}
        body = self._body()
        handle = body.register_forward_hook(lambda module, args, out: _keep_rows(out, keep))
        # Packed weights only at the row counts where they measured faster here.
        pack = self.packed is not None and self.packed.use_packed(len(ids))
        packed = self._routed_linears() if pack else contextlib.nullcontext()
        try:
            with packed:
                out = self.model(
                    input_ids=ids[:, None],
                    position_ids=positions[:, None],
                    attention_mask=cache.no_mask,  # a prepared 4-D mask is passed through untouched; kv_slots masks
                    cache=cache,
                    use_cache=True,
                    logits_to_keep=1,
                    kv_slots=cache,
                    **kwargs,
                )
        finally:
            handle.remove()
        return out.logits[:, -1, :]

    def _routed_linears(self) -> PackedModules:
        """The packed routing of this model's linears, found again only when the model, the packed
        weights or the adapters changed."""
        cached = self._packed_modules
        adapters = tuple(self.adapters)
        if cached is None or cached[0] is not self.model or cached[1] is not self.packed or cached[2] != adapters:
            cached = self._packed_modules = (self.model, self.packed, adapters, PackedModules(self.packed, self.model))
        return cached[3]

    def calibrate_packing(self) -> None:
        """Measure once where packed weights beat torch's linear here (``backends.packed_linear``)."""
        if self.packed is not None and not self.packed.calibrated:
            self.packed.calibrate(m.weight for m in self.model.modules() if isinstance(m, torch.nn.Linear))

    def _body(self) -> torch.nn.Module:
        """The transformer body under the LM head (through peft's wrapper when adapters exist)."""
        model = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        return model.base_model

    def adapter_names(self, adapters: Sequence[str | None]) -> list[str] | None:
        """peft's per-row adapter names for a mixed batch (None when the model has no adapters)."""
        if not self.adapters:
            return None
        return [a if a is not None else BASE_ADAPTER for a in adapters]

    def hit_stop(self, ids: list[int], stop: list[str]) -> bool:
        # Only the tail can contain a newly completed stop string; decode enough of it.
        tail = self.tokenizer.decode(ids[-(max(len(s) for s in stop) + 8) :], skip_special_tokens=True)
        return cut_at_stop(tail, stop)[1]

    def finish(self, row: Row, sampling: SamplingParams) -> Generation:
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
