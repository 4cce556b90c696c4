"""The tokenizer side of a token-in-token-out model: chat template, exact encode / decode, end-of-turn ids.

A local transformers model and a remote server that serves the same weights (vLLM) share it, so the
token ids a remote sampler is given and returns are exactly those the local learner scores.
"""

from __future__ import annotations

from collections.abc import Sequence

from scope_marl.backends.base import Adapters, Generation, Prompts, Seeds
from scope_marl.core.types import Message, SamplingParams


class ChatTokens:
    def __init__(self, tokenizer, default_system_prompt: str | None = None):
        self.tokenizer = tokenizer
        self.default_system_prompt = default_system_prompt
        self.stop_ids = self._end_of_turn_ids(tokenizer)
        self.eot_id = tokenizer.eos_token_id  # what the chat template writes at the end of a turn

    @staticmethod
    def _end_of_turn_ids(tokenizer) -> set[int]:
        ids = {tokenizer.eos_token_id}
        for tok in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
            tid = tokenizer.convert_tokens_to_ids(tok)
            if isinstance(tid, int) and tid != tokenizer.unk_token_id:
                ids.add(tid)
        return {i for i in ids if i is not None}

    # ---- prompts -------------------------------------------------------------------------------
    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True, tools: Sequence[dict] | None = None) -> str:
        """The chat as text through the tokenizer's chat template (``tools``: schemas the template renders).

        A missing system message is filled with ``default_system_prompt`` (when set) so that no
        template-injected default (SmolLM2 names itself otherwise) leaks into a role's context.
        """
        chat = [{"role": m.role, "content": m.content, **({"tool_call_id": m.tool_call_id} if m.tool_call_id else {})} for m in messages]
        if self.default_system_prompt is not None and (not chat or chat[0]["role"] != "system"):
            chat.insert(0, {"role": "system", "content": self.default_system_prompt})
        extra = {"tools": list(tools)} if tools else {}
        return self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=add_generation_prompt, **extra)

    def encode_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        return self.encode_text(self.render_chat(messages, add_generation_prompt))

    def encode_text(self, text: str) -> list[int]:
        """Token ids of rendered chat text (special tokens written in it are parsed, none added)."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int]) -> str:
        """Exact text of token ids, special tokens included."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def generate(self, prompts: Prompts, sampling: SamplingParams, adapters: Adapters = None, seeds: Seeds = None) -> list[Generation]:
        return self.generate_ids([self.encode_chat(p) for p in prompts], sampling, adapters, seeds=seeds)
