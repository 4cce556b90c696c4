"""Deterministic replies for tests and examples: no model, no randomness.

A reply is chosen by a function of the prompt, or taken in turn from a fixed list. A reply that is
an exception instance is raised instead, so tests can make a backend fail on purpose.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from scope_marl.backends.base import Generation, SamplingParams, check_adapters, cut_at_stop
from scope_marl.core.types import Message

Reply = str | BaseException


class ScriptedChatModel:
    def __init__(self, replies: Sequence[Reply] | Callable[[Sequence[Message]], Reply], name: str = "scripted"):
        if not callable(replies) and not replies:
            raise ValueError("ScriptedChatModel needs at least one reply (or a function of the prompt)")
        self.replies = replies
        self.name = name
        self.calls: list[list[Message]] = []  # every prompt seen, in order, for assertions
        self._lock = threading.Lock()

    def _reply(self, prompt: Sequence[Message]) -> Reply:
        with self._lock:
            index = len(self.calls)
            self.calls.append(list(prompt))
        if callable(self.replies):
            return self.replies(prompt)
        return self.replies[index % len(self.replies)]

    def generate(
        self,
        prompts: Sequence[Sequence[Message]],
        sampling: SamplingParams,
        adapters: Sequence[str | None] | None = None,
        seeds: Sequence[int] | None = None,  # nothing is random here
    ) -> list[Generation]:
        check_adapters(adapters, len(prompts), known=[])
        out = []
        for prompt in prompts:
            reply = self._reply(prompt)
            if isinstance(reply, BaseException):
                raise reply
            text, _ = cut_at_stop(reply, sampling.stop)
            # A word stands in for a token so that max_new_tokens still truncates.
            words = text.split()
            finish = "length" if len(words) > sampling.max_new_tokens else "stop"
            out.append(Generation(text=" ".join(words[: sampling.max_new_tokens]) if finish == "length" else text, finish_reason=finish))
        return out
