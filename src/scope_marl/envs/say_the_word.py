"""A tiny built-in environment for tests and examples: get the user to say a word.

Each task has a target word. The agent is rewarded 1 if the user's messages contain the word (as a
whole word, case-insensitive) and 0 otherwise; the user, told to avoid it, gets the opposite. The
conversation ends as soon as the user says it, or after ``max_exchanges`` agent-user exchanges.
Small enough to reason about, and its reward depends on what is said.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from scope_marl.core.types import Message
from scope_marl.envs.base import AGENT, USER, Environment, Task

WORDS = ["apple", "river", "yes", "blue", "seven", "music", "tree", "coffee", "moon", "paper", "green", "bread"]


class SayTheWord(Environment):
    name = "say_the_word"

    def __init__(self, num_tasks: int = 8, max_exchanges: int = 2, agent_first: bool = True):
        if not 1 <= num_tasks <= len(WORDS) * 4:
            raise ValueError(f"num_tasks must be between 1 and {len(WORDS) * 4}, got {num_tasks}")
        self.num_tasks = num_tasks
        self.max_exchanges = max_exchanges
        self.agent_first = agent_first

    def tasks(self, split: str = "train") -> list[Task]:
        # Tasks alternate between splits by index, so train and test never share an id.
        index = {"train": 0, "validation": 1, "test": 2}.get(split)
        if index is None:
            raise ValueError(f"unknown split {split!r}; use train, validation or test")
        return [
            Task(task_id=f"say-{split}-{i}", split=split, data={"word": WORDS[(3 * i + index) % len(WORDS)]}) for i in range(self.num_tasks)
        ]

    def system_prompt(self, task: Task, role: str) -> str:
        word = task.data["word"]
        if role == AGENT:
            return f"You are chatting with a stranger. Get them to say the word '{word}' without saying it yourself. Keep replies short."
        return f"You are a person chatting casually. Never say the word '{word}'. Keep replies short."

    def first_speaker(self, task: Task) -> str:
        return AGENT if self.agent_first else USER

    def said_word(self, task: Task, messages: Sequence[Message]) -> bool:
        pattern = re.compile(rf"\b{re.escape(task.data['word'])}\b", re.IGNORECASE)
        return any(m.role == USER and pattern.search(m.content) for m in messages)

    def is_done(self, task: Task, messages: Sequence[Message]) -> bool:
        return self.said_word(task, messages) or len(messages) >= 2 * self.max_exchanges

    def describe(self) -> dict:
        return {"name": self.name, "num_tasks": self.num_tasks, "max_exchanges": self.max_exchanges}

    def rewards(self, task: Task, messages: Sequence[Message]) -> dict[str, float]:
        r = 1.0 if self.said_word(task, messages) else 0.0
        return {AGENT: r, USER: 1.0 - r}
