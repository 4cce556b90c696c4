"""What an environment gives the rollout engine: tasks, role prompts, turn order, ending, rewards.

An environment knows nothing about models. It is a small, picklable object: the engine (or a Ray
actor hosting it) asks it for tasks, for each role's system prompt, who speaks first, whether the
conversation goes on after each message, and the per-role rewards once it ends.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from scope_marl.core.types import Message

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
    """The chat a model playing ``role`` sees: its own messages as ``assistant``, the other side's as ``user``."""
    chat = [Message(role="system", content=system_prompt)]
    chat += [Message(role="assistant" if m.role == role else "user", content=m.content) for m in messages]
    return chat
