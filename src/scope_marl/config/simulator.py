"""Simulator sections of a config: every mode a user simulator can take, and the short spec strings."""

from __future__ import annotations

import typing
from typing import Annotated, Literal

from pydantic import Field, ValidationError

from scope_marl.config.loading import ConfigError, Section, explain
from scope_marl.core.types import SamplingParams


def default_sampling() -> SamplingParams:
    return SamplingParams(temperature=0.7, top_p=0.95, max_new_tokens=48)


class LLMSimulatorFields(Section):
    id: str | None = Field(None, description="simulator_id recorded in episodes (default: <mode>:<model>)")
    model: str = Field("embedded", description="model spec, see docs/formats.md")
    adapter: str | None = Field(
        None, description="an adapter the model holds, or a saved adapter directory (e.g. scope sft's RUN_DIR/adapter)"
    )
    sampling: SamplingParams = Field(default_factory=default_sampling)
    prompt_prefix: str = Field("", description="put before the environment's user prompt (prompt variant)")


class FrozenSimulatorConfig(LLMSimulatorFields):
    mode: Literal["frozen"] = "frozen"


class PersonaGuidedConfig(LLMSimulatorFields):
    mode: Literal["persona_guided"]
    guidance: str | None = Field(None, description="replaces the built-in guidance text")


class TrainableSimulatorConfig(LLMSimulatorFields):
    mode: Literal["trainable"]
    adapter: str | None = "simulator"
    init: str | None = Field(
        None, description="a saved adapter directory the trained adapter starts from (e.g. scope sft's RUN_DIR/adapter)"
    )


class VerbalizedConfig(LLMSimulatorFields):
    mode: Literal["vs"]
    k: int = Field(5, ge=1)
    method: Literal["prob", "random"] = "prob"
    variant: Literal["standard", "cot", "multi"] = "standard"
    tail_threshold: float | None = Field(None, gt=0, le=1)
    calls: int = Field(2, ge=1, description="VS-Multi: calls that together gather k candidates")
    max_retries: int = Field(2, ge=0)
    constrained: bool | None = Field(None, description="force the JSON shape (default: on for local models)")
    seed: int = 0


class PoolSimulatorConfig(Section):
    mode: Literal["pool"]
    root: str = Field(..., description="pool directory (manifest.json + members/), created by training")
    model: str = "embedded"
    sampling: SamplingParams = Field(default_factory=default_sampling)
    prompt_prefix: str = ""
    seed: int = 0


class RotationConfig(Section):
    mode: Literal["rotation"]
    members: list[MemberConfig] = Field(..., min_length=1)
    order: Literal["round_robin", "random"] = "round_robin"
    seed: int = 0


MemberConfig = Annotated[
    FrozenSimulatorConfig | PersonaGuidedConfig | VerbalizedConfig | TrainableSimulatorConfig,
    Field(discriminator="mode"),
]
SimulatorConfig = Annotated[
    FrozenSimulatorConfig | PersonaGuidedConfig | VerbalizedConfig | TrainableSimulatorConfig | PoolSimulatorConfig | RotationConfig,
    Field(discriminator="mode"),
]
"""A ``simulator`` section: one member per mode, told apart by ``mode``. Adding a mode: its section here
in this union (and in ``MemberConfig`` if a rotation may hold it), and its builder registered with
``@register_simulator(TheConfig)`` in ``scope_marl/assembly.py`` (see docs/architecture.md, Registries)."""
RotationConfig.model_rebuild()
SIMULATOR_CONFIGS: dict[str, type[Section]] = {
    c.model_fields["mode"].annotation.__args__[0]: c for c in typing.get_args(typing.get_args(SimulatorConfig)[0])
}


def parse_simulator_spec(spec: str) -> SimulatorConfig:
    """A simulator config from a short spec string (the CLI's ``--simulator``), see docs/formats.md.

    ``MODE[(key=value,...)]:MODEL`` for one simulator, e.g. ``frozen:embedded``,
    ``vs(k=5,method=random):embedded``, ``persona_guided(temperature=1.0):hf:/models/x``;
    ``rotation:SPEC;SPEC;...`` for a rotation; ``pool:ROOT`` for a population pool.
    Sampling fields (temperature, top_p, max_new_tokens) may be given among the options.
    """
    mode, _, rest = spec.partition(":")
    if mode == "rotation":
        members = [parse_simulator_spec(part.strip()) for part in rest.split(";") if part.strip()]
        if not members:
            raise ConfigError(
                f"simulator spec {spec!r} names no members; use rotation:SPEC;SPEC;..., e.g. rotation:frozen:embedded;vs(k=5):embedded"
            )
        try:
            return RotationConfig(mode="rotation", members=members)
        except ValidationError as err:
            raise ConfigError(f"simulator spec {spec!r}:\n" + explain(err, RotationConfig)) from None
    if mode == "pool":
        return PoolSimulatorConfig(mode="pool", root=rest)
    options: dict = {}
    if "(" in mode:
        mode, _, args = mode.partition("(")
        spec_args, _, rest_after = (args + ":" + rest).partition(")")
        rest = rest_after.lstrip(":")
        for item in filter(None, (a.strip() for a in spec_args.split(","))):
            key, eq, value = item.partition("=")
            if not eq:
                raise ConfigError(f"simulator spec {spec!r}: option {item!r} must be key=value")
            options[key.strip()] = value.strip()
    schema = SIMULATOR_CONFIGS.get(mode)
    if schema is None or not rest:
        raise ConfigError(
            f"simulator spec {spec!r} not understood; use MODE[(key=value,...)]:MODEL with MODE one of "
            f"{', '.join(SIMULATOR_CONFIGS)}, e.g. vs(k=5,method=prob):embedded"
        )
    sampling = {k: options.pop(k) for k in list(options) if k in SamplingParams.model_fields}
    try:
        return schema.model_validate(
            {"mode": mode, "model": rest, **options, **({"sampling": {**default_sampling().model_dump(), **sampling}} if sampling else {})}
        )
    except ValidationError as err:
        raise ConfigError(f"simulator spec {spec!r}:\n" + explain(err, schema)) from None
