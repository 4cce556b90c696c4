"""What an environment gives the rollout engine: tasks, role prompts, turn order, ending, rewards.

An environment knows nothing about models. It is a small, picklable object: the engine (or a Ray
actor hosting it) asks it for tasks, for each role's system prompt, who speaks first, whether the
conversation goes on after each message, and the per-role rewards once it ends.

Environments with tools (tau2) also describe each role's tools as JSON schemas (the OpenAI function
format), open a per-episode state (a database) and execute calls against it. How a model reads the
schemas and writes a call is the model side's business (``backends.tool_format``), not theirs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from scope_marl.core.types import TOOL, Episode, EpisodeStatus, Message, ToolCall

AGENT = "agent"  # the policy being trained
USER = "user"  # the side a simulator plays


class Task(BaseModel):
    """One scenario to play. ``data`` holds environment-specific facts (persona, target, ...)."""

    task_id: str
    split: str = "train"
    data: dict[str, Any] = Field(default_factory=dict)


class Environment(ABC):
    """Base class of every benchmark environment. Two roles: ``agent`` and ``user``."""

    name: str = "environment"
    roles: tuple[str, str] = (AGENT, USER)

    @abstractmethod
    def tasks(self, split: str = "train") -> list[Task]:
        """The tasks of a split (``train``, ``validation`` or ``test``), in a fixed order."""

    @abstractmethod
    def system_prompt(self, task: Task, role: str) -> str:
        """What ``role`` is told before the conversation starts."""

    def first_speaker(self, task: Task) -> str:
        return AGENT

    @abstractmethod
    def is_done(self, task: Task, messages: Sequence[Message]) -> bool:
        """Whether the conversation ends after the last message."""

    @abstractmethod
    def rewards(self, task: Task, messages: Sequence[Message]) -> dict[str, float]:
        """Per-role rewards of a finished conversation."""

    def opening(self, task: Task) -> list[Message]:
        """Messages that stand at the start of every episode before anyone generates (tau2: the
        agent's fixed greeting); default: none."""
        return []

    def tools(self, task: Task, role: str) -> list[dict]:
        """The tools ``role`` may call, as OpenAI function schemas; default: none."""
        return []

    def start(self, task: Task) -> Any:
        """A fresh per-episode state the tools act on (e.g. a database); default: none. The engine keeps it."""
        return None

    def execute(self, task: Task, state: Any, role: str, call: ToolCall) -> Message:
        """Run one tool call of ``role`` on ``state``; returns the ``tool`` message answering it."""
        raise NotImplementedError(f"{self.name} has no tools; {role} called {call.name!r}")

    def finish(self, task: Task, state: Any, episode: Episode) -> None:
        """Score an episode that has ended (any status; ``episode.status`` says which) and release its
        state. Default: rewards from the messages when it COMPLETED, metadata always. An environment
        whose outcome lives in the state rather than the messages (coop: the working copies) overrides it."""
        if episode.status == EpisodeStatus.COMPLETED:
            episode.rewards = self.rewards(task, episode.messages)
        episode.metadata.update(self.episode_metadata(task, episode.messages))

    def group_rewards(self, task: Task, episodes: Sequence[Episode]) -> None:
        """Set rewards that depend on a whole group (every rollout of ``task`` against one simulator)
        once all of its episodes have ended; default: none. tau2's variance curriculum is one: the
        user is rewarded by how split the agent's outcomes over the group are."""
        return None

    def normalize_user_reply(self, task: Task, text: str) -> str:
        """Bring a candidate user reply in line with the environment's rules (default: unchanged)."""
        return text

    def episode_metadata(self, task: Task, messages: Sequence[Message]) -> dict[str, Any]:
        """Facts worth keeping in the episode record (persona, parsed outcome, ...)."""
        return {}

    def reference_texts(self, role: str) -> list[str]:
        """Human-written turns of ``role`` from training data, if the environment has any (evaluation
        measures how much of their range an agent covers); default: none."""
        return []

    def describe(self) -> dict[str, Any]:
        """What a run should record about the environment (source data, split, settings)."""
        return {"name": self.name}

    def other(self, role: str) -> str:
        a, b = self.roles
        return b if role == a else a


def role_view(messages: Sequence[Message], role: str, system_prompt: str) -> list[Message]:
    """The chat a model playing ``role`` sees: its own messages as ``assistant``, the other side's as ``user``.

    With tools, each role sees only its own calls and their results (role ``tool``); a turn that
    called tools went to the environment, so the other side never sees it.
    """
    chat = [Message(role="system", content=system_prompt)]
    for m in messages:
        if m.role == TOOL:
            if m.requestor == role:
                chat.append(m)
        elif m.role == role:
            chat.append(m.model_copy(update={"role": "assistant"}))
        elif m.tool_calls is None:  # a call turn (even one whose calls all failed to parse) is not for the other side
            chat.append(Message(role="user", content=m.content))
    return chat


def malformed_calls(messages: Sequence[Message]) -> dict[str, int]:
    """Tool calls per role that did not parse: the engine answers each with an error result under an
    id that no call of the turn carries (the turn's ``tool_calls`` hold only the calls that parsed)."""
    out: dict[str, int] = {}
    issued: set[str] = set()
    for m in messages:
        if m.role != TOOL:
            issued = {c.id for c in m.tool_calls or []}
        elif m.tool_call_id not in issued and m.requestor is not None:
            out[m.requestor] = out.get(m.requestor, 0) + 1
    return out
