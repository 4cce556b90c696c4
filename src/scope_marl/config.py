"""Experiment configuration: one pydantic schema, loaded from YAML, with errors that name the field.

Every section forbids unknown keys, so a typo is an error that lists the allowed names instead of a
silently ignored setting.
"""

from __future__ import annotations

import os
import typing
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from scope_marl.backends.base import SamplingParams
from scope_marl.rollout.engine import RolloutConfig

Split = Literal["train", "validation", "test"]


class ConfigError(ValueError):
    """A config file that cannot be used; the message names each bad field and the fix."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def default_sampling() -> SamplingParams:
    return SamplingParams(temperature=0.7, top_p=0.95, max_new_tokens=48)


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


EnvConfig = Annotated[SayTheWordConfig | P4GConfig, Field(discriminator="name")]


class AgentConfig(Section):
    model: str = Field("embedded", description="model spec, see docs/formats.md")
    adapter: str | None = None
    sampling: SamplingParams = Field(default_factory=default_sampling)
    prompt_prefix: str = ""
    trainable: bool = True


class LLMSimulatorFields(Section):
    id: str | None = Field(None, description="simulator_id recorded in episodes (default: <mode>:<model>)")
    model: str = Field("embedded", description="model spec, see docs/formats.md")
    adapter: str | None = None
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
RotationConfig.model_rebuild()
SIMULATOR_CONFIGS = {c.model_fields["mode"].annotation.__args__[0]: c for c in typing.get_args(typing.get_args(SimulatorConfig)[0])}


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
        return RotationConfig(mode="rotation", members=members)
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
        return schema.model_validate({"mode": mode, "model": rest, **options, **({"sampling": {**default_sampling().model_dump(), **sampling}} if sampling else {})})
    except ValidationError as err:
        raise ConfigError(f"simulator spec {spec!r}:\n" + explain(err, schema)) from None


class RolloutRunConfig(Section):
    """``scope rollout``: play episodes of one environment and record them."""

    env: EnvConfig = Field(default_factory=SayTheWordConfig)
    split: Split = "train"
    num_tasks: int | None = Field(None, ge=1, description="play only the first N tasks of the split")
    agent: AgentConfig = Field(default_factory=AgentConfig)
    simulator: SimulatorConfig = Field(default_factory=FrozenSimulatorConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)


def load_config(path: str | os.PathLike, schema: type[BaseModel] = RolloutRunConfig) -> BaseModel:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist; see configs/ for examples")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of sections, got {type(data).__name__}")
    try:
        return schema.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{path} has {err.error_count()} invalid field(s):\n" + explain(err, schema)) from None


def explain(err: ValidationError, schema: type[BaseModel]) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        message = e["msg"]
        if e["type"] in ("union_tag_invalid", "union_tag_not_found"):
            where += "." + str(e.get("ctx", {}).get("discriminator", "")).strip("'")
        if e["type"] == "extra_forbidden":
            allowed = _fields_at(schema, e["loc"][:-1])
            message = f"unknown field; allowed fields here: {', '.join(allowed)}" if allowed else "unknown field"
        elif "input" in e and e["type"] not in ("missing",):
            message += f" (got {e['input']!r})"
        lines.append(f"  - {where}: {message}")
    return "\n".join(lines)


def _fields_at(schema: type[BaseModel], loc: tuple) -> list[str]:
    """Field names of the nested model at ``loc`` (best effort; [] when it is not one model).

    A tagged union (``env: {name: p4g}``) appears in ``loc`` as its tag, which selects the member.
    """
    models = [schema]
    for part in loc:
        if isinstance(part, int):  # an item of a list field: the item's model was found at the list
            continue
        if not isinstance(part, str):
            return []
        tagged = [m for m in models if part in _tags(m)]
        if len(models) > 1 and tagged:
            models = tagged
            continue
        field = models[0].model_fields.get(part)
        if field is None:
            return []
        models = [a for a in (field.annotation, *_union_members(field.annotation)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if not models:
            return []
    return list(models[0].model_fields) if len(models) == 1 else []


def _union_members(annotation) -> list:
    out = []
    for arg in typing.get_args(annotation):
        out += [arg, *_union_members(arg)]
    return out


def _tags(model: type[BaseModel]) -> set[str]:
    """The literal values of a model's discriminator field (``name`` or ``mode``)."""
    return {v for key in ("name", "mode") if key in model.model_fields for v in typing.get_args(model.model_fields[key].annotation)}


def dump_config(config: BaseModel, path: str | os.PathLike) -> None:
    Path(path).write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))


# ---- training ----------------------------------------------------------------------------------


class LoraSettings(Section):
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


class EvalSettings(Section):
    every: int = Field(0, ge=0, description="evaluate every N steps (0: never)")
    tasks: int = Field(4, ge=1, description="test tasks per simulator: a fixed, seeded subset of the test split")
    group_size: int = Field(1, ge=1, description="samples per task")
    split: Split = Field("test", description="test (the issue's default) or validation: the best checkpoint is chosen on this split")
    panel: str | None = Field(None, description="a panel YAML path or built-in name (offline, api); replaces `simulator`")
    simulator: SimulatorConfig = Field(
        default_factory=lambda: FrozenSimulatorConfig(
            id="heldout-skeptic", prompt_prefix="You are skeptical and careful with money.",
            sampling=SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=48),
        ),
        description="the one held-out simulator when no panel is given",
    )


class PoolSettings(Section):
    every: int = Field(16, ge=1, description="snapshot the trainable simulator every N steps")
    max_size: int = Field(10, ge=2)
    selection: Literal["random", "latest", "prioritized"] = "random"


class TrainConfig(Section):
    """``scope train``: one experiment arm."""

    model: str = Field("embedded", description="the base model every LoRA adapter sits on (a local model spec)")
    env: EnvConfig = Field(default_factory=SayTheWordConfig)
    agent_sampling: SamplingParams = Field(default_factory=default_sampling)
    simulator: SimulatorConfig = Field(default_factory=FrozenSimulatorConfig)
    trainable_roles: list[Literal["agent", "user"]] = Field(default_factory=lambda: ["agent"], min_length=1)
    finetune: Literal["lora", "full"] = Field("lora", description="the agent as a LoRA adapter, or every weight of its own copy")
    lora: LoraSettings = Field(default_factory=LoraSettings)
    learner: dict = Field(default_factory=dict, description="LearnerConfig fields for the agent")
    simulator_learner: dict | None = Field(None, description="LearnerConfig fields for the simulator (default: as the agent)")
    rollout: RolloutConfig = Field(default_factory=lambda: RolloutConfig(group_size=4, max_concurrent=32))
    tasks_per_step: int = Field(4, ge=1)
    steps: int = Field(10, ge=1)
    eval: EvalSettings = Field(default_factory=EvalSettings)
    checkpoint_every: int = Field(5, ge=1)
    keep_last: int = Field(2, ge=1)
    pool: PoolSettings | None = Field(None, description="population co-training: snapshots of the trainable simulator")
    seed: int = 0
    threads: int | None = Field(None, ge=1, description="torch threads (fix it for reproducible runs)")
    deterministic: bool = Field(False, description="torch.use_deterministic_algorithms, for number-for-number resumes")
    tensorboard: bool = Field(False, description="also write every metric to RUN_DIR/tensorboard (pip install 'scope-marl[tensorboard]')")

    @model_validator(mode="after")
    def _roles_match_simulator(self) -> TrainConfig:
        if "user" in self.trainable_roles and self.simulator.mode != "trainable":
            raise ValueError(f"trainable_roles includes 'user' but simulator.mode is {self.simulator.mode!r}; use mode: trainable (co-training)")
        if self.simulator.mode == "trainable" and "user" not in self.trainable_roles:
            raise ValueError("simulator.mode is 'trainable' but 'user' is not in trainable_roles; add it, or use mode: frozen")
        if self.finetune == "full" and self.trainable_roles != ["agent"]:
            raise ValueError("finetune: full trains the agent only (trainable_roles: [agent]); co-training keeps both roles as LoRA adapters")
        if self.pool is not None and self.simulator.mode != "trainable":
            raise ValueError("pool (population co-training) needs simulator.mode: trainable")
        return self
