"""Core data types shared by every layer: messages, sampling settings, per-role training streams, episodes.

The JSON form of these types (``Episode.model_dump_json()``) is the on-disk record of a rollout;
``docs/formats.md`` documents it field by field. Keep the two in step.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

TOOL = "tool"  # the role of a message that carries a tool's result back to the role that called it


def _omit_none(data: dict, keys: tuple[str, ...]) -> dict:
    """Leave optional fields out of the JSON while unset, so records written before they existed
    and records of environments without tools keep their exact bytes."""
    for key in keys:
        if data.get(key) is None:
            data.pop(key, None)
    return data


class ToolCall(BaseModel):
    """One call of an environment tool (the OpenAI function-call shape): ``arguments`` is a JSON object.

    ``requestor``: the role whose tools the call uses and who gets its result. None (always, for
    calls a model wrote here) means the role of the message that carries the call; it is set only
    where a trajectory from elsewhere carries a call for another role (tau2: a user's device call
    inside an agent message), so converting it back gives the trajectory it came from.
    """

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    requestor: str | None = None

    @model_serializer(mode="wrap")
    def _compact(self, handler):
        return _omit_none(handler(self), ("requestor",))


class Message(BaseModel):
    """One message of a conversation.

    In a chat prompt handed to a backend, ``role`` is a chat role (``system``, ``user``,
    ``assistant``). In an :class:`Episode`, ``role`` names the environment role that spoke
    (e.g. ``agent`` or ``user``); each model later sees its own messages as ``assistant``.

    Tool use: a turn that calls tools carries ``tool_calls`` (a list, empty when every call in it
    failed to parse) and goes to the environment, not to the other side (``content`` is whatever
    text came with the calls). The environment answers each call
    with a message of role ``tool`` naming the call (``tool_call_id``) and who made it
    (``requestor``); ``error`` marks a call that failed or did not parse. ``raw`` keeps a model's
    verbatim output when ``content`` is only part of it (the text around its tool-call markup), so
    the model's own context shows exactly what it wrote.
    """

    model_config = ConfigDict(frozen=True)

    role: str
    content: str
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    requestor: str | None = None
    error: bool | None = None
    raw: str | None = None

    @model_serializer(mode="wrap")
    def _compact(self, handler):
        return _omit_none(handler(self), ("tool_calls", "tool_call_id", "requestor", "error", "raw"))


class SamplingParams(BaseModel):
    """How one generate call samples. A core type because configs, backends and simulators all carry it."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(1.0, ge=0.0, description="0 means greedy decoding")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(64, ge=1)
    stop: list[str] = Field(default_factory=list, description="stop strings; the text is cut before them")
    seed: int | None = None


class EpisodeStatus(str, Enum):
    """How an episode ended. Only COMPLETED episodes are used for training by default."""

    COMPLETED = "COMPLETED"  # the environment ended it normally
    TRUNCATED = "TRUNCATED"  # a turn hit the token limit (or the context length)
    FAILED = "FAILED"  # a backend or environment error; ``Episode.error`` says which


class RoleStream(BaseModel):
    """The token stream one trainable role produced in one episode, ready for the learner.

    ``prompt_ids`` is the context before the role's first generated token. ``response_ids``
    is everything after it: the role's sampled tokens (``loss_mask`` 1) interleaved with the
    other role's messages and chat-template glue (``loss_mask`` 0). ``logprobs`` and
    ``entropies`` are recorded at generation time for the sampled tokens (0.0 where the mask
    is 0), under the temperature-scaled full next-token distribution, before top-p.
    """

    role: str
    prompt_ids: list[int]
    response_ids: list[int] = Field(default_factory=list)
    loss_mask: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    entropies: list[float] = Field(default_factory=list)
    adapter: str | None = None  # LoRA adapter that generated the tokens (None: base model)
    reward: float | None = None

    @model_validator(mode="after")
    def _aligned(self) -> RoleStream:
        n = len(self.response_ids)
        for name in ("loss_mask", "logprobs", "entropies"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"RoleStream.{name} has {len(getattr(self, name))} items but response_ids has {n}; "
                    "every per-token list must align with response_ids"
                )
        return self

    @property
    def num_sampled_tokens(self) -> int:
        return sum(self.loss_mask)


class Episode(BaseModel):
    """One dialogue between the agent and a simulator, with everything needed to train on it."""

    episode_id: str
    task_id: str
    group_id: str  # rollouts of one task that share a GRPO baseline (and one simulator)
    simulator_id: str  # which simulator (or pool member) played the user side
    split: str = "train"
    messages: list[Message] = Field(default_factory=list)
    streams: dict[str, RoleStream] = Field(default_factory=dict)  # one per trainable role
    rewards: dict[str, float] = Field(default_factory=dict)  # per environment role
    status: EpisodeStatus = EpisodeStatus.COMPLETED
    error: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)  # seconds, by phase
    tool_errors: int | None = None  # tool calls that did not parse (None: the environment has no tools)

    @model_serializer(mode="wrap")
    def _compact(self, handler):
        return _omit_none(handler(self), ("tool_errors",))
