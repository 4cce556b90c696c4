"""The one protocol every text generator implements, and the types it speaks.

Log-prob definition (binding, see docs/interfaces.md): the log-prob of a sampled token is its
log-probability under the model's full next-token distribution after temperature scaling and
before top-p truncation; the entropy is that distribution's entropy. With ``temperature == 0``
decoding is greedy and both are reported at temperature 1.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from scope_marl.core.types import Message, SamplingParams


class BackendError(RuntimeError):
    """A backend could not produce a generation. The message names the cause and the fix."""


class ContextLengthError(BackendError):
    """A prompt does not fit the model's context. The rollout engine records such episodes as TRUNCATED."""


FinishReason = Literal["stop", "length"]
# The arguments every backend's generate / generate_ids takes, named once: one entry per prompt each.
Prompts = Sequence[Sequence[Message]]
PromptIds = Sequence[Sequence[int]]
Adapters = Sequence[str | None] | None  # an adapter name per prompt (None: the model itself)
CacheKeys = Sequence[Hashable | None] | None  # a conversation key per prompt, for the prefix cache
Seeds = Sequence[int] | None  # a sampling seed per prompt


@dataclass
class Generation:
    """One completion.

    ``token_ids`` are exactly the sampled ids, including the end-of-turn token when the model
    emitted one and the ids of a matched stop string; ``text`` is the decoded reply without the
    end-of-turn token and cut before a stop string. ``logprobs`` / ``entropies`` align with
    ``token_ids``; remote backends may leave them ``None`` (the server did not return them).
    """

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    entropies: list[float] | None = None
    finish_reason: FinishReason = "stop"
    prompt_ids: list[int] | None = None  # the exact prompt the tokens continue, when known

    @property
    def mean_logprob(self) -> float | None:
        if not self.logprobs:
            return None
        return sum(self.logprobs) / len(self.logprobs)


@runtime_checkable
class ChatModel(Protocol):
    """Batched generation from chat messages.

    ``adapters`` selects, per prompt, a LoRA adapter by name (``None`` = the base model with
    adapters disabled). Backends without adapters accept only ``None`` entries.

    ``seeds`` gives each prompt its own random stream (one generator per row), so what a row
    samples does not depend on which other rows share its batch; without it the call draws from
    one stream seeded by ``sampling.seed``.
    """

    name: str

    def generate(self, prompts: Prompts, sampling: SamplingParams, adapters: Adapters = None, seeds: Seeds = None) -> list[Generation]: ...


@runtime_checkable
class TokenChatModel(ChatModel, Protocol):
    """A local model that also works token-in-token-out (what the rollout engine and learner need)."""

    stop_ids: set[int]  # token ids that end a turn
    eot_id: int  # the end-of-turn token the chat template writes
    context_length: int

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True, tools: Sequence[dict] | None = None) -> str: ...

    def encode_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]: ...

    def encode_text(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def generate_ids(
        self, prompt_ids: PromptIds, sampling: SamplingParams, adapters: Adapters = None, cache_keys: CacheKeys = None, seeds: Seeds = None
    ) -> list[Generation]: ...

    def release(self, cache_keys: Iterable[Hashable]) -> None: ...


def check_adapters(adapters: Sequence[str | None] | None, n: int, known: Sequence[str]) -> list[str | None]:
    """Expand ``adapters`` to one entry per prompt and reject names the backend does not hold."""
    if adapters is None:
        return [None] * n
    if len(adapters) != n:
        raise BackendError(f"got {len(adapters)} adapter names for {n} prompts; pass one per prompt or None")
    unknown = sorted({a for a in adapters if a is not None and a not in known})
    if unknown:
        raise BackendError(
            f"unknown LoRA adapter(s) {unknown}; this backend holds {sorted(known) or 'none'}. "
            "Load them first with add_adapter(name, path_or_config)."
        )
    return list(adapters)


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Cut ``text`` before the earliest stop string. Returns (text, whether one was found)."""
    cut = min((i for s in stop if s and (i := text.find(s)) >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
