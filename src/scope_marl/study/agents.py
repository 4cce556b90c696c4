"""The study's conditions as live agents, and the prompt each one sees.

Every condition is an agent as ``scope eval`` loads it (the base model, or a run's checkpoint); the
conditions on the same base model share one loaded copy, each with its own LoRA adapter, so one
generate call serves participants of every condition at once. The agent plays the P4G persuader
with the persona of the participant's task card; the participant is the persuadee.
"""

from __future__ import annotations

from dataclasses import dataclass

from scope_marl.assembly import ModelCache, build_env
from scope_marl.backends.base import ChatModel
from scope_marl.config.study import StudyConfig
from scope_marl.core.types import Message
from scope_marl.envs.base import AGENT, USER, Task, role_view
from scope_marl.envs.p4g.donation import PAYMENT
from scope_marl.envs.p4g.personas import persona_text
from scope_marl.evaluation.evaluate import load_agent
from scope_marl.study.store import PARTICIPANT, StoredMessage


@dataclass
class StudyAgent:
    condition: str
    chat: ChatModel
    adapter: str | None


class Conditions:
    """Agents per condition, the task cards, and the prompt for a conversation so far."""

    def __init__(self, config: StudyConfig, models: ModelCache | None = None):
        self.config = config
        self.env = build_env(config.env)
        self.tasks: dict[str, Task] = {t.task_id: t for t in self.env.tasks(config.split)}
        if not self.tasks:
            raise ValueError(f"the P4G {config.split} split has no tasks; choose another split")
        models = models or ModelCache()
        self.agents = {}
        for c in config.conditions:
            loaded = load_agent(c.agent, c.model, models, name=f"study-{c.name}")
            self.agents[c.name] = StudyAgent(c.name, loaded.chat, loaded.adapter)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.config.conditions]

    def card(self, task_id: str) -> str:
        text = self.config.card.format(payment=PAYMENT)
        if self.config.show_persona:
            text += "\n\nPlease answer as this person: " + persona_text(self.tasks[task_id].data["persuadee"])
        return text

    def prompt(self, task_id: str, history: list[StoredMessage]) -> list[Message]:
        """The agent's chat: the persuader's system prompt for this task, its own turns as assistant."""
        task = self.tasks[task_id]
        messages = [Message(role=USER if m.role == PARTICIPANT else AGENT, content=m.content) for m in history]
        return role_view(messages, AGENT, self.env.system_prompt(task, AGENT))
