"""``scope study serve`` configs: a human study where real people talk to trained agents.

A study names its conditions (each an agent: the base model or a training run's checkpoint), the
Persuasion-for-Good task cards its participants read, the survey they answer, and the limits that
keep a public server safe. Conditions are assigned server-side and never shown to participants.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from scope_marl.config.env import P4GConfig
from scope_marl.config.loading import Section, load_config
from scope_marl.core.types import SamplingParams


class Condition(Section):
    """One arm of the study: whom a participant assigned to it talks to."""

    name: str = Field(..., pattern=r"^[A-Za-z0-9_.-]{1,40}$", description="shown only on admin pages and in reports")
    agent: str = Field("base", description="base (the untrained model), a run directory (its best checkpoint) or a checkpoint directory")
    model: str | None = Field(
        None, description="the base model spec (embedded, hf:PATH, openai:..., scripted:...); default: embedded, or the run's own model"
    )


class SurveyQuestion(Section):
    id: str = Field(..., pattern=r"^[A-Za-z0-9_]{1,40}$")
    text: str
    kind: Literal["likert", "text"] = Field("likert", description="likert: an integer 1..scale; text: free text")
    scale: int = Field(7, ge=2, le=11)
    required: bool = True


class Limits(Section):
    """What one participant may do; beyond each, the server answers with a clear page, not a crash."""

    max_turns: int = Field(10, ge=1, description="participant messages per conversation")
    max_minutes: float = Field(20.0, gt=0, description="from the first message to the end of the conversation")
    max_message_chars: int = Field(1000, ge=1, description="one participant message")
    max_request_bytes: int = Field(16_384, ge=1024, description="any request body (the limit is checked before it is read)")
    requests_per_minute: int = Field(60, ge=1, description="per token")
    queue: int = Field(64, ge=1, description="replies waiting for generation; beyond it a participant is asked to wait")


DEFAULT_SURVEY = [
    SurveyQuestion(id="persuasive", text="How persuasive was your partner?"),
    SurveyQuestion(id="natural", text="How natural did the conversation feel?"),
    SurveyQuestion(id="respectful", text="How respectful was your partner?"),
    SurveyQuestion(id="comments", text="Anything else you want to tell us? (optional)", kind="text", required=False),
]

DEFAULT_CARD = (
    "You are a crowd worker on a research platform and you earned ${payment:.2f} for this task. Another worker "
    "will chat with you about Save the Children, a charity that helps children in developing countries. You may "
    "donate any part of your payment, or nothing; what you state at the end is what you give."
)


class StudyConfig(Section):
    """A whole study, from one YAML file."""

    title: str = "Persuasion study"
    conditions: list[Condition] = Field(..., min_length=1)
    target_per_condition: int = Field(20, ge=1, description="completed participants wanted per condition (admin progress)")
    card: str = Field(DEFAULT_CARD, description="the situation every participant reads ({payment} is filled in)")
    show_persona: bool = Field(False, description="also show the task's persuadee persona for the participant to play")
    env: P4GConfig = Field(
        default_factory=lambda: P4GConfig(name="p4g", source="auto", word_limit=50),
        description="where the task cards (the agent's persona) come from: the P4G split below",
    )
    split: Literal["train", "validation", "test"] = "test"
    survey: list[SurveyQuestion] = Field(default_factory=lambda: list(DEFAULT_SURVEY))
    sampling: SamplingParams = Field(default_factory=lambda: SamplingParams(temperature=0.7, top_p=0.95, max_new_tokens=96))
    limits: Limits = Field(default_factory=Limits)
    consent: str = Field(
        "This is a research study about conversational agents. You will chat with a partner, state a donation and "
        "answer a few questions. Your messages are stored without your name. You may withdraw at any time, which "
        "deletes everything you wrote.",
        description="the consent text shown before anything else",
    )
    redirect_url: str | None = Field(None, description="sent to after completion, with ?code=COMPLETION_CODE (a recruiting platform's)")
    seed: int = 0

    @model_validator(mode="after")
    def _distinct(self) -> StudyConfig:
        names = [c.name for c in self.conditions]
        if len(set(names)) != len(names):
            raise ValueError(f"condition names must be distinct, got {names}")
        ids = [q.id for q in self.survey]
        if len(set(ids)) != len(ids):
            raise ValueError(f"survey question ids must be distinct, got {ids}")
        return self


def load_study(path) -> StudyConfig:
    """A study file, validated (unknown keys and bad values are errors that name the field)."""
    return load_config(path, StudyConfig)
