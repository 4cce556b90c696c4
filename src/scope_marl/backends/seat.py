"""A seat: one LLM playing one role of a conversation (the agent, or an LLM simulator).

The rollout engine batches turns by seat model, builds each seat's prompts token-in-token-out
when the model allows it, and records a training stream for trainable seats.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scope_marl.backends.base import ChatModel, SamplingParams


@dataclass
class Seat:
    model: ChatModel
    sampling: SamplingParams = field(default_factory=SamplingParams)
    adapter: str | None = None  # LoRA adapter on ``model``; None = base with adapters disabled
    prompt_prefix: str = ""  # put before the environment's system prompt for this role
    trainable: bool = False  # record a RoleStream for the learner

    def system_prompt(self, env_prompt: str) -> str:
        return f"{self.prompt_prefix.rstrip()}\n\n{env_prompt}" if self.prompt_prefix else env_prompt

    @property
    def batch_key(self) -> tuple:
        """Turns with equal keys can share one generate call (same model, same sampling)."""
        return (id(self.model), self.sampling.model_dump_json(exclude={"seed"}))
