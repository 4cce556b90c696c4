"""Tool-call formats by name (``rollout.tool_format.agent`` / ``.simulator``): how a model is shown
its tools and how its calls are read back, in the model family's own convention.

| name | tools shown | a call is written | results come back as |
|---|---|---|---|
| ``hermes`` | by the chat template when it renders tools (Qwen), else in the system prompt as text | ``<tool_call>{"name", "arguments"}</tool_call>`` | role ``tool`` (template) / ``<tool_response>`` user turn (text) |
| ``llama3_json`` | by the chat template (Llama 3.1-3.3) | the whole reply ``{"name", "parameters"}`` (``<|python_tag|>`` optional, ``; `` between calls) | role ``ipython`` |
| ``mistral`` | by the chat template | ``[TOOL_CALLS][{"name", "arguments"}, ...]`` (or ``[TOOL_CALLS]name[ARGS]{...}``) | role ``tool`` |

``auto`` (the default) asks the model's chat template: a template that renders a tool schema given to
it (``apply_chat_template(..., tools=...)``) names its family by its markup; a template that ignores
tools (SmolLM2's) gets Hermes as text, as before. The names are vLLM's ``--tool-call-parser`` names.

Parsing uses transformers' response parser (``transformers.utils.chat_parsing``, the machinery of
``tokenizer.parse_response``) with one response template per family; Hermes keeps its own block-by-block
parser (``tool_format.parse_tool_calls``), which names what is wrong with each bad block. A reply that
tries a call and does not parse is one malformed call, answered with an error and counted, never fatal.

Every format renders a role's own turns as the text it sampled (``raw``), so the chat template sees
exactly what the stream holds and the token-in-token-out accounting (masks, log-probs) is the same for
all of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from scope_marl.backends.tool_format import ParsedTurn, format_turn, parse_tool_calls, tool_chat
from scope_marl.core.registry import Registry
from scope_marl.core.types import TOOL, Message, ToolCall

TOOL_FORMATS: Registry[type[ToolFormat]] = Registry("tool format", "@TOOL_FORMATS.register in scope_marl/backends/tool_formats.py")


class ToolFormatError(ValueError):
    """A tool format that cannot work with the model's chat template."""


@dataclass
class ToolFormat:
    """One family's convention. ``in_template``: the chat template renders the tools (they go to it as
    ``tools=``); otherwise they are text in the system prompt."""

    name: str = ""
    in_template: bool = True
    tool_role: str = TOOL
    response_template: dict | None = None  # transformers' response-parser spec

    def chat(self, view: Sequence[Message], tools: Sequence[dict]) -> list[Message]:
        """A role's structured view (system first, its own turns as ``assistant``, results as ``tool``)
        as the messages its chat template renders."""
        chat = []
        for m in view:
            if m.role == TOOL:
                chat.append(Message(role=self.tool_role, content=m.content, tool_call_id=m.tool_call_id))
            elif m.role == "assistant" and (m.raw is not None or m.tool_calls is not None):
                chat.append(Message(role="assistant", content=m.raw if m.raw is not None else self.write(m.content, m.tool_calls or [])))
            else:
                chat.append(Message(role=m.role, content=m.content))
        return chat

    def template_tools(self, tools: Sequence[dict]) -> list[dict] | None:
        """What goes to the chat template as ``tools=`` (None: the tools are in the text)."""
        return list(tools) if self.in_template and tools else None

    def parse(self, text: str, id_prefix: str) -> ParsedTurn:
        """The calls of a reply; call ids are ``{id_prefix}-{k}`` in order."""
        raise NotImplementedError

    def write(self, content: str, calls: Sequence[ToolCall]) -> str:
        """The canonical text of a turn with calls (a scripted player's turn; a turn recorded without ``raw``)."""
        raise NotImplementedError


@TOOL_FORMATS.register("hermes")
class Hermes(ToolFormat):
    def __init__(self, in_template: bool = False):
        super().__init__("hermes", in_template)

    def chat(self, view, tools):
        return super().chat(view, tools) if self.in_template else tool_chat(view, tools)

    def parse(self, text, id_prefix):
        return parse_tool_calls(text, id_prefix)

    def write(self, content, calls):
        return format_turn(content, calls)


def _calls_from(parsed: dict, id_prefix: str) -> tuple[list[ToolCall], list[tuple[str, str]]]:
    """ToolCalls from a response parser's message dict; a call without a name or with non-object arguments is malformed."""
    calls, malformed = [], []
    for k, item in enumerate(parsed.get("tool_calls") or []):
        function = item.get("function", {}) if isinstance(item, dict) else {}
        name, arguments = function.get("name"), function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        if not isinstance(name, str) or not name:
            malformed.append((f"{id_prefix}-{k}", 'the call must name its function with a "name" string'))
        elif not isinstance(arguments, dict):
            malformed.append((f"{id_prefix}-{k}", "the call's arguments must be a JSON object"))
        else:
            calls.append(ToolCall(id=f"{id_prefix}-{k}", name=name, arguments=arguments))
    return calls, malformed


class _TemplateParsed(ToolFormat):
    """A family whose replies are read by transformers' response parser."""

    call_marker: re.Pattern  # a reply matching it tries a call; one that then does not parse is malformed

    def parse(self, text, id_prefix):
        if not self.call_marker.search(text):
            return ParsedTurn(text)
        from transformers.utils.chat_parsing import parse_response

        try:
            parsed = parse_response(text, self.spec_for(text), prefix="")
        except (ValueError, KeyError, TypeError) as err:
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            return ParsedTurn(text, [], [(f"{id_prefix}-0", f"the {self.name} call does not parse ({reason})")])
        calls, malformed = _calls_from(parsed, id_prefix)
        if not calls and not malformed:
            return ParsedTurn(text)
        return ParsedTurn(str(parsed.get("content") or "").strip(), calls, malformed)

    def spec_for(self, text: str) -> dict:
        assert self.response_template is not None
        return self.response_template


_LLAMA_CALL_HEAD = r'\{\s*"name"\s*:\s*"(?P<name>[^"]+)"\s*,\s*"(?:parameters|arguments)"\s*:\s*'


@TOOL_FORMATS.register("llama3_json")
class Llama3Json(_TemplateParsed):
    """Llama 3.x JSON tool calling: the reply is the call (vLLM's ``llama3_json``: it must start with ``{``
    or ``<|python_tag|>``; text before a call makes the reply plain content)."""

    call_marker = re.compile(r"\A\s*(?:<\|python_tag\|>\s*)?\{")

    def __init__(self):
        super().__init__(
            "llama3_json",
            True,
            "ipython",
            {
                "defaults": {"role": "assistant"},
                "start_anchor": "<|start_header_id|>assistant<|end_header_id|>\n\n",
                "fields": {
                    "tool_calls": {
                        "open_pattern": r"(?:\A\s*(?:<\|python_tag\|>\s*)?|(?<=\}\s*;)\s*)" + _LLAMA_CALL_HEAD,
                        "close_pattern": r'\}\s*(?:;(?=\s*\{\s*"name")|<\|eot_id\|>|<\|eom_id\|>|\Z)',
                        "repeats": True,
                        "content": "json",
                        "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
                    },
                    "content": {"close_pattern": r"\s*(?:<\|eot_id\|>|<\|eom_id\|>)", "content": "text", "repeats": True, "join": "\n"},
                },
            },
        )

    def parse(self, text, id_prefix):
        turn = super().parse(text, id_prefix)
        if turn.has_calls or not self.call_marker.search(text):
            return turn
        # It starts like a call but the parser took it for text ({"parameters": ...} first, no name): a bad call.
        return ParsedTurn(text, [], [(f"{id_prefix}-0", 'the call must be {"name": ..., "parameters": {...}} with "name" first')])

    def write(self, content, calls):
        return "; ".join(json.dumps({"name": c.name, "parameters": c.arguments}, ensure_ascii=False) for c in calls) or content


@TOOL_FORMATS.register("mistral")
class Mistral(_TemplateParsed):
    """Mistral's ``[TOOL_CALLS]``: a JSON list of calls (v3 templates), or ``name[ARGS]{...}`` per call (v11)."""

    call_marker = re.compile(r"\[TOOL_CALLS\]")
    _V3: ClassVar[dict] = {
        "defaults": {"role": "assistant"},
        "start_anchor": "[/INST]",
        "fields": {
            "tool_calls": {
                "open": "[TOOL_CALLS]",
                "close": "</s>",
                "content": "json",
                "transform_each": True,
                "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{arguments}"}},
            },
            "content": {"close": "</s>", "content": "text", "repeats": True, "join": "\n"},
        },
    }
    _V11: ClassVar[dict] = {
        "defaults": {"role": "assistant"},
        "start_anchor": "[/INST]",
        "fields": {
            "tool_calls": {
                "open_pattern": r"\[TOOL_CALLS\](?P<name>[^\[\]\s]+)(?:\[CALL_ID\][^\[]*)?\[ARGS\]",
                "close_pattern": r"(?=\[TOOL_CALLS\])|</s>",
                "repeats": True,
                "content": "json",
                "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
            },
            "content": {"close": "</s>", "content": "text", "repeats": True, "join": "\n"},
        },
    }

    def __init__(self):
        super().__init__("mistral", True, TOOL, self._V3)

    def spec_for(self, text):
        return self._V3 if re.search(r"\[TOOL_CALLS\]\s*\[", text) else self._V11

    def write(self, content, calls):
        block = "[TOOL_CALLS]" + json.dumps([{"name": c.name, "arguments": c.arguments} for c in calls], ensure_ascii=False)
        return f"{content}{block}" if calls else content


# ---- choosing a role's format ----------------------------------------------------------------------
_PROBE_TOOL = {
    "type": "function",
    "function": {"name": "probe_tool_zq", "description": "probe", "parameters": {"type": "object", "properties": {}}},
}
_FAMILY_MARKERS = (("mistral", "[TOOL_CALLS]"), ("hermes", "<tool_call>"), ("llama3_json", "<|python_tag|>"), ("llama3_json", "ipython"))


def renders_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template shows a tool schema given to it."""
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    try:
        text = tokenizer.apply_chat_template(chat, tools=[_PROBE_TOOL], tokenize=False, add_generation_prompt=True)
    except Exception:
        return False
    return "probe_tool_zq" in text


def template_family(tokenizer) -> str | None:
    """The tool format a chat template's markup names, or None."""
    source = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    return next((name for name, marker in _FAMILY_MARKERS if marker in source), None)


def resolve_tool_format(setting: str, model) -> ToolFormat:
    """The format ``setting`` (``auto`` or a registered name) gives a role played by ``model``.

    A model without a local chat template (an API model) writes Hermes text. ``llama3_json`` and
    ``mistral`` need a template that renders tools; ``auto`` on a template that renders tools in an
    unknown markup is an error naming the formats to choose from.
    """
    tokenizer = getattr(model, "tokenizer", None)
    in_template = tokenizer is not None and renders_tools(tokenizer)
    if setting == "auto":
        if not in_template:
            return Hermes(in_template=False)
        family = template_family(tokenizer)
        if family is None:
            raise ToolFormatError(
                f"the chat template renders tools but its call markup is none of {', '.join(TOOL_FORMATS.names())}; "
                "set rollout.tool_format.agent / .simulator to the format the model was trained on"
            )
        setting = family
    cls = TOOL_FORMATS.get(setting)
    if cls is Hermes:
        return Hermes(in_template=in_template)
    if not in_template:
        where = "this model has no local chat template" if tokenizer is None else "its chat template ignores tools"
        raise ToolFormatError(
            f"tool_format {setting} needs a chat template that renders tools, and {where}; use tool_format: hermes (tools as text)"
        )
    return cls()
