"""A frozen LLM simulator: any backend, a prompt variant, fixed sampling; never updated."""

from __future__ import annotations

from collections.abc import Sequence

from scope_marl.backends.base import ChatModel, SamplingParams
from scope_marl.seat import Seat
from scope_marl.simulators.base import Simulator, SimulatorTurn
from scope_marl.types import Message


class FrozenSimulator(Simulator[str]):
    """The single-simulator baseline of the paper. The rollout engine drives its :attr:`seat`
    directly (batched with other turns on the same model); :meth:`respond` serves callers
    outside the engine."""

    def __init__(
        self,
        model: ChatModel,
        sampling: SamplingParams | None = None,
        prompt_prefix: str = "",
        adapter: str | None = None,
        simulator_id: str | None = None,
    ):
        self.seat = Seat(model=model, sampling=sampling or SamplingParams(), adapter=adapter, prompt_prefix=prompt_prefix)
        self.simulator_id = simulator_id or f"frozen:{model.name}" + (f"+{adapter}" if adapter else "")

    def respond(self, turns: Sequence[SimulatorTurn]) -> list[str]:
        chats = []
        for turn in turns:
            system, *rest = turn.context
            chats.append([Message(role="system", content=self.seat.system_prompt(system.content)), *rest])
        adapters = [self.seat.adapter] * len(chats)
        return [g.text for g in self.seat.model.generate(chats, self.seat.sampling, adapters if self.seat.adapter else None)]
