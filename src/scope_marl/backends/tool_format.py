"""How a model that has no tool support in its chat template sees and calls tools: the Hermes
convention, as text.

Environments describe their tools as JSON schemas (the OpenAI function format) and speak in
structured messages (``Message.tool_calls``, role ``tool``); what a model reads and writes is text.
This module is the translation, on the model side:

- the tool schemas go into the system prompt inside ``<tools></tools>``;
- a call is written ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in the model's turn;
- results come back in the next (user-side) turn as ``<tool_response>...</tool_response>``.

vLLM's and verl's Hermes parsers read the same markup, so a model trained here calls tools the way
those servers expect. SmolLM2's template has no tool support (``tools=`` is dropped, a
``tool_calls`` message raises), which is why the text form is the default.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from scope_marl.core.types import TOOL, Message, ToolCall

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)

TOOLS_PREAMBLE = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{schemas}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


@dataclass
class ParsedTurn:
    """A model's turn split into what it says and what it calls.

    ``content`` is the text outside the tool-call blocks. ``calls`` are the blocks that parsed;
    ``malformed`` has one reason per block that did not (bad JSON, no name, arguments not an
    object, no closing tag), each paired with the call id it is answered under.
    """

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    malformed: list[tuple[str, str]] = field(default_factory=list)  # (call id, reason)

    @property
    def has_calls(self) -> bool:
        return bool(self.calls or self.malformed)


def parse_tool_calls(text: str, id_prefix: str) -> ParsedTurn:
    """Every ``<tool_call>`` block of ``text``; call ids are ``{id_prefix}-{k}`` in order."""
    calls, malformed = [], []
    for k, match in enumerate(_CALL.finditer(text)):
        call_id = f"{id_prefix}-{k}"
        body = match.group(1).strip()
        if not match.group(0).endswith(CALL_CLOSE):
            malformed.append((call_id, f"the call has no closing {CALL_CLOSE}"))
            continue
        try:
            value = json.loads(body)
        except json.JSONDecodeError as err:
            malformed.append((call_id, f"the call is not valid JSON ({err.msg} at character {err.pos})"))
            continue
        if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
            malformed.append((call_id, 'the call must be a JSON object with a "name" string'))
            continue
        arguments = value.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        if not isinstance(arguments, dict):
            malformed.append((call_id, '"arguments" must be a JSON object'))
            continue
        calls.append(ToolCall(id=call_id, name=value["name"], arguments=arguments))
    content = _CALL.sub("", text).strip() if calls or malformed else text
    return ParsedTurn(content, calls, malformed)


def format_call(call: ToolCall) -> str:
    return f"{CALL_OPEN}\n{json.dumps({'name': call.name, 'arguments': call.arguments}, ensure_ascii=False)}\n{CALL_CLOSE}"


def format_turn(content: str, calls: Sequence[ToolCall]) -> str:
    """The canonical text of a turn with calls (what a scripted player writes, and how a turn recorded
    without ``raw`` is shown back to its author)."""
    blocks = "\n".join(format_call(c) for c in calls)
    return f"{content}\n{blocks}" if content and blocks else content or blocks


def tools_system_prompt(system_prompt: str, tools: Sequence[dict]) -> str:
    schemas = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return f"{system_prompt.rstrip()}\n\n{TOOLS_PREAMBLE.format(schemas=schemas)}"


def tool_chat(view: Sequence[Message], tools: Sequence[dict]) -> list[Message]:
    """A role's structured view (system first, its own turns as ``assistant``, tool results as
    ``tool``) as plain chat messages any template renders: tools in the system prompt, calls as the
    model wrote them, consecutive tool results in one user turn."""
    system, *rest = view
    chat = [Message(role="system", content=tools_system_prompt(system.content, tools))]
    for m in rest:
        if m.role == TOOL:
            block = f"<tool_response>\n{m.content}\n</tool_response>"
            if chat[-1].role == "user" and chat[-1].content.startswith("<tool_response>"):
                chat[-1] = Message(role="user", content=f"{chat[-1].content}\n{block}")
            else:
                chat.append(Message(role="user", content=block))
        elif m.role == "assistant" and (m.raw is not None or m.tool_calls is not None):
            chat.append(Message(role="assistant", content=m.raw if m.raw is not None else format_turn(m.content, m.tool_calls or [])))
        else:
            chat.append(Message(role=m.role, content=m.content))
    return chat


# ---- the call notation of a Verbalized Sampling candidate ---------------------------------------
# A VS candidate is one field of a JSON object, written by a small model inside a string that stops
# at a quote or a newline, so Hermes markup (quotes, newlines) cannot appear there. A candidate that
# calls a tool is written as code instead: ``toggle_airplane_mode()`` or
# ``set_network_mode_preference(mode=4g_5g_preferred)``, values unquoted (JSON where they parse).
_NOTATION = re.compile(r"^\s*`*\s*(?:call\s*:?\s*)?([A-Za-z_][A-Za-z0-9_]*)\s*\((.*)\)\s*`*\s*\.?\s*$", re.S | re.I)


def _split_arguments(text: str) -> list[str]:
    """Top-level comma-separated parts (commas inside brackets or quotes stay)."""
    parts, depth, quote, current = [], 0, "", []
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _value(text: str):
    text = text.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
            return text[1:-1]
        return text


def parse_call_notation(text: str, tools: Sequence[dict]) -> tuple[str, dict] | None:
    """``name(arg=value, ...)`` naming one of ``tools`` -> (name, arguments); anything else -> None.
    Positional values take the schema's parameters in order."""
    match = _NOTATION.match(text)
    if match is None:
        return None
    schemas = {t["function"]["name"]: t["function"] for t in tools}
    name = match[1]
    if name not in schemas:
        return None
    order = list(schemas[name].get("parameters", {}).get("properties", {}))
    arguments: dict = {}
    for i, part in enumerate(_split_arguments(match[2])):
        key, sep, value = part.partition("=")
        if not sep:
            key, sep, value = part.partition(":")
        if sep and re.fullmatch(r"\s*[A-Za-z_][A-Za-z0-9_]*\s*", key):
            arguments[key.strip()] = _value(value)
        elif i < len(order):
            arguments[order[i]] = _value(part)
        else:
            return None  # more positional values than the tool has parameters: not a call of it
    return name, arguments


def notation_example(tools: Sequence[dict]) -> str:
    """A call of the first tool in the notation, with its required parameters as placeholders."""
    function = tools[0]["function"]
    required = function.get("parameters", {}).get("required", [])
    return f"{function['name']}(" + ", ".join(f"{p}=<{p}>" for p in required) + ")"
