"""Persuasion for Good as an environment: the agent persuades, the simulator is the persuadee.

One task per corpus dialogue, carrying both participants' surveys (personas) and the human outcome
for analysis. Without the corpus, tasks come from :class:`PersonaSampler` (survey marginals), so the
environment still runs on a fresh clone. Reward: the agent gets the episode donation / 2; the
persuadee gets 1 - r (``adversarial``, it keeps the money) or r (``cooperative``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal

from scope_marl.core.types import Message
from scope_marl.envs.base import AGENT, USER, Environment, Task
from scope_marl.envs.p4g.corpus import find_corpus_dir, read_dialogues, read_participants
from scope_marl.envs.p4g.donation import PAYMENT, episode_donation, has_donation_tag, parse_donation
from scope_marl.envs.p4g.personas import PersonaSampler, persona_text
from scope_marl.envs.p4g.split import DEFAULT_FRACTIONS, SPLITS, check_disjoint, split_ids

# The persona comes first and the task last: small models follow the most recent instruction
# and otherwise tend to recite the persona instead of acting on it.
PERSUADER_PROMPT = (
    "About you: {persona}\n\n"
    "You are a crowd worker chatting with another worker on a research platform. Your goal: persuade them to "
    "donate some or all of their ${payment:.0f} task payment to Save the Children, a charity that helps children "
    "in developing countries with health, education and safety. Ask for a specific amount, such as $1. "
    "Be friendly and concrete. Reply in under {words} words."
)
PERSUADEE_PROMPT = (
    "About you: {persona}\n\n"
    "You are a crowd worker chatting with another worker on a research platform. You earned ${payment:.0f} for "
    "this task and you value that money: do not give it away easily, only if you are truly persuaded. Act as the "
    "person described above, in your own words. Reply in under {words} words. If you decide to donate, state the "
    "amount exactly as [DONATE $N], for example [DONATE $0.50]. If you will not donate, say so."
)


class PersuasionForGood(Environment):
    name = "p4g"

    def __init__(
        self,
        data_dir: str | None = None,
        source: Literal["auto", "corpus", "synthetic"] = "auto",
        synthetic_tasks: int = 200,
        max_exchanges: int = 5,
        termination: Literal["eager", "fixed"] = "eager",
        simulator_reward: Literal["adversarial", "cooperative"] = "adversarial",
        word_limit: int = 50,
        accept_proposals: bool = False,
        split_fractions: tuple[float, float, float] = DEFAULT_FRACTIONS,
        seed: int = 0,
    ):
        self.max_exchanges = max_exchanges
        self.termination = termination
        self.simulator_reward = simulator_reward
        self.word_limit = word_limit
        self.accept_proposals = accept_proposals
        self.split_fractions = tuple(split_fractions)
        corpus = find_corpus_dir(data_dir, required=source == "corpus") if source != "synthetic" else None
        self.source = "corpus" if corpus is not None else "synthetic"
        self.corpus_dir = str(corpus) if corpus is not None else None
        tasks = self._corpus_tasks(corpus) if corpus is not None else self._synthetic_tasks(synthetic_tasks, seed)
        donated = {t.task_id: t.data["human"]["persuadee_donation"] > 0 for t in tasks}
        by_id = {t.task_id: t for t in tasks}
        self._splits = {
            name: [by_id[i].model_copy(update={"split": name}) for i in ids]
            for name, ids in split_ids(donated, self.split_fractions).items()
        }
        check_disjoint({name: [t.task_id for t in ts] for name, ts in self._splits.items()})

    # ---- tasks -------------------------------------------------------------------------------
    @staticmethod
    def _corpus_tasks(corpus) -> list[Task]:
        tasks = []
        for did, people in read_participants(corpus).items():
            if AGENT not in people or USER not in people:
                continue
            tasks.append(
                Task(
                    task_id=did,
                    data={
                        "source": "corpus",
                        "persuader": people[AGENT].survey,
                        "persuadee": people[USER].survey,
                        "human": {
                            "persuadee_donation": people[USER].donation or 0.0,
                            "persuader_donation": people[AGENT].donation or 0.0,
                            "turns": people[USER].turns,
                        },
                    },
                )
            )
        return tasks

    @staticmethod
    def _synthetic_tasks(n: int, seed: int) -> list[Task]:
        sampler, rng = PersonaSampler(), random.Random(seed)
        rate = sampler.donation_rate()
        return [
            Task(
                task_id=f"synthetic-{seed}-{i:05d}",
                data={
                    "source": "synthetic",
                    "persuader": sampler.sample(AGENT, rng),
                    "persuadee": sampler.sample(USER, rng),
                    # Stands in for the human outcome only to stratify the split.
                    "human": {"persuadee_donation": 1.0 if rng.random() < rate else 0.0, "persuader_donation": None, "turns": None},
                },
            )
            for i in range(n)
        ]

    def tasks(self, split: str = "train") -> list[Task]:
        if split not in self._splits:
            raise ValueError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
        return list(self._splits[split])

    def reference_texts(self, role: str) -> list[str]:
        """The human turns of ``role`` in the corpus dialogues of the training split (none for synthetic tasks)."""
        if self.corpus_dir is None:
            return []
        train = {t.task_id for t in self._splits["train"]}
        dialogues = read_dialogues(self.corpus_dir)
        return [m.content for did in sorted(train & set(dialogues)) for m in dialogues[did] if m.role == role and m.content]

    def describe(self) -> dict:
        return {
            "name": self.name,
            "source": self.source,
            "corpus_dir": self.corpus_dir,
            "split": {
                "method": "sha256(dialogue id), stratified by persuadee donated",
                "fractions": self.split_fractions,
                "sizes": {name: len(ts) for name, ts in self._splits.items()},
            },
            "max_exchanges": self.max_exchanges,
            "termination": self.termination,
            "simulator_reward": self.simulator_reward,
        }

    # ---- conversation ------------------------------------------------------------------------
    def system_prompt(self, task: Task, role: str) -> str:
        template, survey = (PERSUADER_PROMPT, task.data["persuader"]) if role == AGENT else (PERSUADEE_PROMPT, task.data["persuadee"])
        return template.format(payment=PAYMENT, words=self.word_limit, persona=persona_text(survey))

    def first_speaker(self, task: Task) -> str:
        return AGENT

    def is_done(self, task: Task, messages: Sequence[Message]) -> bool:
        if len(messages) >= 2 * self.max_exchanges:
            return True
        if self.termination == "eager" and messages and messages[-1].role == USER:
            # A donation tag ([DONATE $N], $0 included) settles the conversation; talk about money does not.
            return has_donation_tag(messages[-1].content)
        return False

    def normalize_user_reply(self, task: Task, text: str) -> str:
        """A candidate that commits to a positive amount must carry the tag the reward reads first."""
        amount = parse_donation(text)
        if amount is not None and amount > 0 and not has_donation_tag(text):
            return f"{text.rstrip()} [DONATE ${amount:.2f}]"
        return text

    def donation(self, messages: Sequence[Message]) -> float:
        return episode_donation(messages, accept_proposals=self.accept_proposals)

    def rewards(self, task: Task, messages: Sequence[Message]) -> dict[str, float]:
        r = self.donation(messages) / PAYMENT
        return {AGENT: r, USER: 1.0 - r if self.simulator_reward == "adversarial" else r}

    def episode_metadata(self, task: Task, messages: Sequence[Message]) -> dict:
        return {
            "donation": self.donation(messages),
            "stated_donations": [parse_donation(m.content) if m.role == USER else None for m in messages],
            "persuader_persona": persona_text(task.data["persuader"]),
            "persuadee_persona": persona_text(task.data["persuadee"]),
            "human_donation": task.data["human"]["persuadee_donation"],
            "task_source": task.data["source"],
        }
