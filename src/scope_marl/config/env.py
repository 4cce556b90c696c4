"""Environment sections of a config: which benchmark, its tasks, turns and reward settings."""

from __future__ import annotations

import typing
from typing import Annotated, Literal

from pydantic import Field

from scope_marl.config.loading import Section

Split = Literal["train", "validation", "test"]


class SayTheWordConfig(Section):
    name: Literal["say_the_word"] = "say_the_word"
    num_tasks: int = Field(8, ge=1, le=48)
    max_exchanges: int = Field(2, ge=1)
    agent_first: bool = True


class P4GConfig(Section):
    """Persuasion for Good: the agent persuades, the simulator is the persuadee."""

    name: Literal["p4g"]
    data_dir: str | None = Field(None, description="corpus folder; default $SCOPE_P4G_DIR, then ../shared/data/p4g")
    source: Literal["auto", "corpus", "synthetic"] = Field(
        "auto", description="auto: the corpus when found, else personas sampled from the survey marginals"
    )
    synthetic_tasks: int = Field(200, ge=3)
    max_exchanges: int = Field(5, ge=1)
    termination: Literal["eager", "fixed"] = Field("eager", description="eager ends at a stated donation")
    simulator_reward: Literal["adversarial", "cooperative"] = "adversarial"
    word_limit: int = Field(50, ge=5)
    accept_proposals: bool = Field(False, description="a persuadee 'sure, I'll do that' takes the amount just proposed")
    split_fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
    seed: int = 0


class Tau2Config(Section):
    """tau2-bench (the tau2 extra): a customer-service agent with tools, the simulator plays the customer."""

    name: Literal["tau2"]
    domain: Literal["mock", "retail", "airline", "telecom"] = "retail"
    max_steps: int = Field(
        200, ge=1, description="tau2's step cap: every message is a step, and each batch of tool results; reaching it scores 0"
    )
    max_errors: int = Field(10, ge=1, description="failed tool calls (both sides) that end the episode, scored 0, as in tau2")
    judge: str | None = Field(
        None,
        description="model spec of an LLM judge for tasks scored by natural-language assertions (none of the default splits needs one)",
    )
    simulator_reward: Literal["cooperative", "adversarial", "curriculum"] = Field(
        "cooperative",
        description="the user's reward: r (cooperative), 1 - r (adversarial), or the variance curriculum "
        "exp(-(var - 0.25)^2 / 0.02) of the agent's success variance over the task's group (needs simulator_learner.baseline: batch)",
    )
    malformed_call_penalty: float = Field(
        0.1,
        ge=0,
        description="taken from a role's reward per tool call of its own that did not parse (capped at 1, tau2's reward range; 0: off)",
    )


class CoopConfig(Section):
    """Cooperative coding (CooperBench-style): the agent and a partner (the simulator) each implement one feature."""

    name: Literal["coop"]
    setting: Literal["coop", "solo"] = Field("coop", description="coop: two seats, one feature each; solo: the agent alone, both features")
    tasks_dir: str | None = Field(
        None, description="folder of {repo}_task/task{id}/ tasks, each with its tree in repo/; default: the built-in tasks"
    )
    max_steps: int = Field(40, ge=2, description="messages (tool calls and results included) after which the episode ends and is scored")
    tool_output_chars: int = Field(2000, ge=100, description="a tool result longer than this is cut (keeps contexts in bounds)")
    partial_credit: bool = Field(False, description="reward the fraction of features that pass instead of 1 only when both do")
    merge: Literal["plain", "union"] = Field(
        "plain", description="plain git merge as CooperBench; union keeps both sides of a conflict (not CooperBench's)"
    )
    test_timeout_s: float = Field(30.0, gt=0, description="wall-clock limit of one sandboxed test run")
    test_memory_mb: int = Field(1024, ge=64, description="address-space limit of one sandboxed test run")
    runtime: Literal["auto", "local", "docker"] = Field(
        "auto",
        description="where a task's runner.sh runs: docker (the task's image from its Dockerfile), local (a mount namespace for "
        "runners written for CooperBench's container, else directly), or auto (docker when a daemon answers and the task has a "
        "Dockerfile, else local)",
    )
    network: Literal["allow", "deny"] | None = Field(
        None, description="allow or deny every runner the network (pip installs); default: each task's coop.json, else deny"
    )


EnvConfig = Annotated[SayTheWordConfig | P4GConfig | Tau2Config | CoopConfig, Field(discriminator="name")]
"""An ``env`` section: one member per environment, told apart by ``name``. Adding an environment: its
section here (a ``name: Literal["..."]`` field) in this union, and its builder registered with
``@register_env(TheConfig)`` in ``scope_marl/assembly.py`` (see docs/architecture.md, Registries)."""
ENV_CONFIGS: dict[str, type[Section]] = {
    c.model_fields["name"].annotation.__args__[0]: c for c in typing.get_args(typing.get_args(EnvConfig)[0])
}
"""Each environment's section schema by its ``name``."""
