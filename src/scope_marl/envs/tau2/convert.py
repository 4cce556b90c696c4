"""Our episode messages <-> tau2's message objects: the one conversion, tested both ways.

Roles: our ``agent`` is tau2's ``assistant`` (a requestor too), ``user`` is ``user``, ``tool`` is
``tool``. Fields map one to one (content, tool calls with id / name / arguments / requestor, a tool
result's call id, requestor and error flag), so ours -> tau2 -> ours and tau2 -> ours -> tau2 are the
identity. A call's requestor is kept only where it differs from its message's role (a user's device
call inside an agent message): ``ToolCall.requestor`` is None otherwise. Two things tau2 has no field
for are carried in the call message's ``raw_data``:

- ``raw``: a model's verbatim turn when its text held tool-call markup;
- results of calls that did not parse: tau2 replays every call of a trajectory and requires each
  result to follow its call, so an answer to a call that never parsed cannot stand in tau2's list.

Empty text is ``None`` in tau2 and ``""`` here. tau2's turn indices and timestamps are not kept.
"""

from __future__ import annotations

from collections.abc import Sequence

from scope_marl.core.types import TOOL, Message, ToolCall
from scope_marl.envs.tau2.package import quiet_import

AGENT, USER = "agent", "user"
TAU2_ROLE = {AGENT: "assistant", USER: "user"}
OUR_ROLE = {v: k for k, v in TAU2_ROLE.items()}


def _models():
    return quiet_import("tau2.data_model.message")


def to_tau2(messages: Sequence[Message]) -> list:
    """tau2 messages (AssistantMessage / UserMessage / ToolMessage) for our episode messages."""
    m = _models()
    out = []
    owner, owner_ids = None, set()  # the call message the current tool results answer, and its parsed call ids
    for message in messages:
        if message.role == TOOL:
            if owner is not None and message.tool_call_id not in owner_ids:  # the answer to a call that did not parse
                unparsed = [*(owner.raw_data or {}).get("unparsed_results", []), {"id": message.tool_call_id, "content": message.content}]
                owner.raw_data = {**(owner.raw_data or {}), "unparsed_results": unparsed}
            else:
                requestor = TAU2_ROLE[message.requestor or AGENT]
                out.append(
                    m.ToolMessage(
                        id=message.tool_call_id or "", role="tool", content=message.content, requestor=requestor, error=bool(message.error)
                    )
                )
            continue
        role = TAU2_ROLE[message.role]
        calls = None
        if message.tool_calls is not None:
            calls = [
                m.ToolCall(id=c.id, name=c.name, arguments=dict(c.arguments), requestor=TAU2_ROLE[c.requestor] if c.requestor else role)
                for c in message.tool_calls
            ]
        raw_data = {"raw": message.raw} if message.raw is not None else None
        cls = m.AssistantMessage if role == "assistant" else m.UserMessage
        out.append(cls(role=role, content=message.content or None, tool_calls=calls, raw_data=raw_data))
        owner, owner_ids = (out[-1], {c.id for c in message.tool_calls}) if message.tool_calls is not None else (None, set())
    return out


def from_tau2(messages: Sequence) -> list[Message]:
    """Our messages for tau2 messages (system messages are left out: our prompts are built per role)."""
    out: list[Message] = []
    pending: list[Message] = []  # results of unparsed calls, placed after the parsed calls' results
    for message in messages:
        role = message.role
        if role == "system":
            continue
        if role == "tool":
            out.append(
                Message(
                    role=TOOL,
                    content=message.content or "",
                    tool_call_id=message.id,
                    requestor=OUR_ROLE[message.requestor],
                    error=message.error,
                )
            )
            continue
        _place(out, pending)
        raw_data = message.raw_data or {}
        calls = None
        if message.tool_calls is not None:
            calls = [
                ToolCall(
                    id=c.id, name=c.name, arguments=dict(c.arguments), requestor=None if c.requestor == role else OUR_ROLE[c.requestor]
                )
                for c in message.tool_calls
            ]
        out.append(Message(role=OUR_ROLE[role], content=message.content or "", tool_calls=calls, raw=raw_data.get("raw")))
        pending = [
            Message(role=TOOL, content=u["content"], tool_call_id=u["id"], requestor=OUR_ROLE[role], error=True)
            for u in raw_data.get("unparsed_results", [])
        ]
    _place(out, pending)
    return out


def _place(out: list[Message], pending: list[Message]) -> None:
    """Merge unparsed-call results back among the call's results, in call order (ids end in -k)."""
    if not pending:
        return
    start = len(out)
    while start > 0 and out[start - 1].role == TOOL:
        start -= 1
    results = out[start:] + pending
    results.sort(key=lambda r: _call_index(r.tool_call_id))
    out[start:] = results
    pending.clear()


def _call_index(call_id: str | None) -> int:
    tail = (call_id or "").rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0
