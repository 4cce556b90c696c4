"""The simulator protocol, generic over what a reply is.

LLM environments get text replies; the collapse lab gets discrete acts. The same mode classes
(frozen, rotation, verbalized sampling, trainable, pool) serve both, because a mode only decides
*who* answers and *how*, not what an answer is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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
    rules: Callable[[str], str] | None = None  # the environment's rule for a user reply (e.g. P4G donation tag)
    tools: list[dict] = field(default_factory=list)  # the user's tools (tau2 telecom), as OpenAI function schemas


@dataclass
class Response(Generic[Reply]):
    """A reply plus what the simulator wants recorded about this turn (candidates, draws, retries)."""

    reply: Reply
    info: dict = field(default_factory=dict)


class Simulator(ABC, Generic[Reply]):
    simulator_id: str

    def for_group(self, group_index: int) -> Simulator[Reply]:
        """The simulator that plays every rollout of one GRPO group.

        All rollouts of a group must face the same simulator so that the group baseline compares
        like with like; modes with several members (rotation, pool) pick one here. A single
        simulator is its own member.
        """
        return self

    def direct_seat(self):
        """A Seat the rollout engine may drive itself (batched, token-in-token-out), or None when the
        simulator must answer through :meth:`respond` (scripted, discrete, multi-call modes)."""
        return None

    def identity(self) -> dict:
        """What an episode records about the simulator that played it, to split results by simulator."""
        return {"id": self.simulator_id}

    def batch_metrics(self, episodes: Sequence) -> dict:
        """Mode-specific figures over a batch of episodes it played, merged into the rollout summary
        (Verbalized Sampling: parse and fallback rates). The recorder calls this hook, so it need not
        know any mode."""
        return {}

    @abstractmethod
    def respond(self, turns: Sequence[SimulatorTurn]) -> list[Reply | Response[Reply]]:
        """Replies for a batch of pending user turns, in order (optionally wrapped in a Response)."""
