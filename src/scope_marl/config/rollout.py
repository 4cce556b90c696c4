"""Rollout sections of a config: the engine's settings, the agent seat, and ``scope rollout`` as a whole."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from scope_marl.config.env import EnvConfig, SayTheWordConfig, Split
from scope_marl.config.hardware import HardwareSettings
from scope_marl.config.loading import Section
from scope_marl.config.simulator import FrozenSimulatorConfig, SimulatorConfig, default_sampling
from scope_marl.core.types import SamplingParams

ToolFormatName = Literal["auto", "hermes", "llama3_json", "mistral"]
"""Tool-call formats; each but auto is registered under its name in ``backends.tool_formats.TOOL_FORMATS``."""


class ToolFormatSettings(Section):
    """Per role, how its model is shown tools and writes calls: its chat template's own family (auto), or one by name."""

    agent: ToolFormatName = Field(
        "auto", description="auto: the family the chat template renders tools in; hermes text when it renders none"
    )
    simulator: ToolFormatName = Field("auto", description="the simulator's (user role's) format, chosen as the agent's")


class RolloutConfig(Section):
    """How the rollout engine plays: group size, concurrency, seed, what a turn at its token limit does."""

    group_size: int = Field(4, ge=1, description="rollouts per task; they share a GRPO baseline and one simulator")
    max_concurrent: int = Field(64, ge=1, description="episodes in flight at once (bounds memory and batch size)")
    seed: int = 0
    on_turn_limit: Literal["truncate", "continue"] = Field(
        "truncate",
        description="a turn that hits max_new_tokens ends the episode as TRUNCATED, or is kept cut short and play goes on",
    )
    on_empty_reply: Literal["fail", "keep"] = Field(
        "fail",
        description="an empty or whitespace-only simulator reply ends the episode FAILED (a malformed turn), or is kept as a silent turn",
    )
    max_tool_calls: int = Field(
        30, ge=0, description="tool calls per episode, all roles together; one more ends the episode TRUNCATED (environments with tools)"
    )
    max_steps: int | None = Field(
        None, ge=1, description="messages per episode, tool results included; reaching it ends the episode TRUNCATED (None: no cap)"
    )
    progress: bool = True
    tool_format: ToolFormatSettings = Field(
        default_factory=ToolFormatSettings, description="environments with tools: each role's call format"
    )


class AgentConfig(Section):
    model: str = Field("embedded", description="model spec, see docs/formats.md")
    adapter: str | None = None
    sampling: SamplingParams = Field(default_factory=default_sampling)
    prompt_prefix: str = ""
    trainable: bool = True


class RaySettings(Section):
    """Rollout workers on Ray (``executor: ray``)."""

    address: str | None = Field(None, description="join this Ray cluster (e.g. ray://head:10001 or auto); none: start a local one")
    workers: int = Field(2, ge=1, description="rollout workers (actors), each with its own models; a GRPO group never spans two")
    threads: int = Field(1, ge=1, description="torch threads per worker")
    num_cpus: float = Field(1.0, ge=0, description="CPUs Ray reserves per worker")
    learner_gpus: float = Field(0.0, ge=0, description="scope train: GPUs Ray gives the learner actor (it reserves no CPU)")


class ExecutorSettings(Section):
    """Where plays run, for a command whose config has no such section (``scope eval --ray-workers N``)."""

    executor: Literal["local", "ray"] = "local"
    ray: RaySettings = Field(default_factory=RaySettings)


class RolloutRunConfig(Section):
    """``scope rollout``: play episodes of one environment and record them."""

    env: EnvConfig = Field(default_factory=SayTheWordConfig)
    split: Split = "train"
    num_tasks: int | None = Field(None, ge=1, description="play only the first N tasks of the split")
    agent: AgentConfig = Field(default_factory=AgentConfig)
    simulator: SimulatorConfig = Field(default_factory=FrozenSimulatorConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    executor: Literal["local", "ray"] = Field("local", description="play in this process, or on Ray rollout workers (the ray extra)")
    ray: RaySettings = Field(default_factory=RaySettings)
    hardware: HardwareSettings = Field(default_factory=HardwareSettings, description="device and precision of the local models")
