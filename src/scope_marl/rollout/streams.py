"""Token-in-token-out context of one role in one episode.

The learner must score exactly the ids the role sampled, in exactly the context it sampled them
in. Re-tokenizing the final transcript would not give that (a sampled sequence need not be the
canonical tokenization of its text). So each role's context grows by appending: its sampled ids
(loss mask 1, with their rollout log-probs), then, before its next turn, the chat-template text
of what happened since, tokenized as a masked delta.
"""

from __future__ import annotations

from collections.abc import Sequence

from scope_marl.backends.base import BackendError, Generation, TokenChatModel
from scope_marl.core.types import Message, RoleStream


class TemplateError(BackendError):
    """The chat template does not render a conversation's prefix as a prefix of its text."""


class StreamBuilder:
    def __init__(self, role: str, model: TokenChatModel, adapter: str | None, tools: Sequence[dict] | None = None):
        self.role = role
        self.model = model
        self.tools = tools  # schemas the chat template renders (None: none, or they are in the text)
        self.stream: RoleStream | None = None
        self._adapter = adapter
        self._rendered = ""  # template text of the view up to the role's last own message
        self._ended_on_eot = True

    @property
    def context_ids(self) -> list[int]:
        assert self.stream is not None
        return self.stream.prompt_ids + self.stream.response_ids

    def prompt(self, view: Sequence[Message]) -> list[int]:
        """The ids to generate from, given the role's view of the conversation so far."""
        full = self.model.render_chat(view, add_generation_prompt=True, tools=self.tools)
        if self.stream is None:
            self.stream = RoleStream(role=self.role, prompt_ids=self.model.encode_text(full), adapter=self._adapter)
            return list(self.stream.prompt_ids)
        if not full.startswith(self._rendered):
            raise TemplateError(
                "the chat template re-renders earlier turns differently once later turns exist; "
                "token-in-token-out streams need a prefix-stable template (e.g. one that does not strip past reasoning)"
            )
        delta = self._glue() + full[len(self._rendered) :]
        ids = self.model.encode_text(delta)
        self._extend(ids, [0] * len(ids), [0.0] * len(ids), [0.0] * len(ids))
        return self.context_ids

    def add_turn(self, view_with_reply: Sequence[Message], generation: Generation) -> None:
        """Append the sampled ids of the role's turn; ``view_with_reply`` ends with that reply."""
        n = len(generation.token_ids)
        self._extend(generation.token_ids, [1] * n, generation.logprobs or [0.0] * n, generation.entropies or [0.0] * n)
        self._rendered = self.model.render_chat(view_with_reply, add_generation_prompt=False, tools=self.tools)
        self._ended_on_eot = bool(generation.token_ids) and generation.token_ids[-1] in self.model.stop_ids

    def _glue(self) -> str:
        """Template text between the role's last sampled token and the next message.

        The rendered view ends with ``reply + <end-of-turn> + tail`` (SmolLM2: tail = newline). When the
        reply ended on the end-of-turn token, only the tail is missing; when it ended on a stop
        string, the end-of-turn token is added as glue too (the stop string's ids stay in the stream).
        """
        eot = self.model.decode([self.model.eot_id])
        cut = self._rendered.rfind(eot)
        tail = self._rendered[cut + len(eot) :] if cut >= 0 else ""
        return tail if self._ended_on_eot else eot + tail

    def _extend(self, ids, mask, logprobs, entropies) -> None:
        s = self.stream
        s.response_ids.extend(ids)
        s.loss_mask.extend(mask)
        s.logprobs.extend(logprobs)
        s.entropies.extend(entropies)
