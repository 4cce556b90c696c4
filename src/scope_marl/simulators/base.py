"""The simulator protocol, generic over what a reply is.

LLM environments get text replies; the collapse lab gets discrete acts. The same mode classes
(frozen, rotation, verbalized sampling, trainable, pool) serve both, because a mode only decides
*who* answers and *how*, not what an answer is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from scope_marl.envs.base import Task

Reply = TypeVar("Reply")


@dataclass
class SimulatorTurn:
    """One pending user turn. ``context`` is what the simulator conditions on: for LLM environments
    the chat as the simulator sees it (system prompt, then the agent's messages as ``user``)."""

    episode_id: str
    task: Task
    context: Any


class Simulator(ABC, Generic[Reply]):
    simulator_id: str

    def for_group(self, group_index: int) -> Simulator[Reply]:
        """The simulator that plays every rollout of one GRPO group.

        All rollouts of a group must face the same simulator so that the group baseline compares
        like with like; modes with several members (rotation, pool) pick one here. A single
        simulator is its own member.
        """
        return self

    @abstractmethod
    def respond(self, turns: Sequence[SimulatorTurn]) -> list[Reply]:
        """Replies for a batch of pending user turns, in order."""
