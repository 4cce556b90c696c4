"""LLM simulators: a seat (model, adapter, sampling, prompt variant) playing the user side.

:class:`FrozenSimulator` is never updated (the single-simulator baseline of the paper);
:class:`~scope_marl.simulators.trainable.TrainableSimulator` is the same thing with its seat marked
trainable. The rollout engine drives the seat directly (batched with other turns on the same
model, token-in-token-out); :meth:`respond` serves callers outside the engine.
"""

from __future__ import annotations

from collections.abc import Sequence

from scope_marl.backends.base import ChatModel, SamplingParams
from scope_marl.backends.seat import Seat
from scope_marl.core.types import Message
from scope_marl.simulators.base import Simulator, SimulatorTurn


class LLMSimulator(Simulator[str]):
    kind = "llm"
    trainable = False
    default_adapter: str | None = None  # used when no adapter is given

    def __init__(
        self,
        model: ChatModel,
        sampling: SamplingParams | None = None,
        prompt_prefix: str = "",
        adapter: str | None = None,
        simulator_id: str | None = None,
    ):
        adapter = adapter if adapter is not None else self.default_adapter
        self.seat = Seat(
            model=model, sampling=sampling or SamplingParams(), adapter=adapter, prompt_prefix=prompt_prefix, trainable=self.trainable
        )
        self.simulator_id = simulator_id or f"{self.kind}:{model.name}" + (f"+{adapter}" if adapter else "")

    def direct_seat(self):
        return self.seat

    def identity(self) -> dict:
        seat = self.seat
        return {
            "id": self.simulator_id,
            "mode": self.kind,
            "model": seat.model.name,
            "adapter": seat.adapter,
            "prompt_prefix": seat.prompt_prefix,
            "temperature": seat.sampling.temperature,
        }

    def chats(self, turns: Sequence[SimulatorTurn]) -> list[list[Message]]:
        """Each turn's context with this simulator's prompt variant applied to the system message."""
        out = []
        for turn in turns:
            system, *rest = turn.context
            out.append([Message(role="system", content=self.seat.system_prompt(system.content)), *rest])
        return out

    def respond(self, turns: Sequence[SimulatorTurn]) -> list[str]:
        chats = self.chats(turns)
        adapters = [self.seat.adapter] * len(chats) if self.seat.adapter else None
        return [g.text for g in self.seat.model.generate(chats, self.seat.sampling, adapters)]


class FrozenSimulator(LLMSimulator):
    kind = "frozen"
