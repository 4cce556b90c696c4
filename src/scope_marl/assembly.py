"""Build live objects (models, environment, seats, simulator, engine) from a config.

Models are loaded once per spec string, so an agent and a simulator that name the same model share
one instance, and the engine can batch their turns together. Environments and simulator modes are
built by the builders registered in ``ENVIRONMENTS`` (``@register_env``, by the ``env`` section's
``name``) and ``SIMULATOR_MODES`` (``@register_simulator``, by the ``simulator`` section's ``mode``);
heavy environments import themselves inside their builder.
"""

from __future__ import annotations

import hashlib
import typing
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel

from scope_marl.backends import ChatModel, load_backend
from scope_marl.backends.placement import resolve_placement
from scope_marl.backends.seat import Seat
from scope_marl.config import (
    AgentConfig,
    CoopConfig,
    EnvConfig,
    FrozenSimulatorConfig,
    LLMSimulatorFields,
    P4GConfig,
    PersonaGuidedConfig,
    PoolSimulatorConfig,
    RolloutRunConfig,
    RotationConfig,
    SayTheWordConfig,
    SimulatorConfig,
    Tau2Config,
    TrainableSimulatorConfig,
    VerbalizedConfig,
)
from scope_marl.core.registry import Registry
from scope_marl.core.types import Message, SamplingParams
from scope_marl.envs import Environment, SayTheWord
from scope_marl.rollout.engine import RolloutEngine
from scope_marl.simulators import PERSONA_GUIDANCE, FrozenSimulator, Rotation, Simulator, TrainableSimulator, persona_guided


class ModelCache:
    """Loaded models by spec string, every local one on ``placement`` (a ``backends.placement.Placement``;
    default the CPU in float32)."""

    def __init__(self, placement=None) -> None:
        self._models: dict[str, ChatModel] = {}
        self.placement = placement

    def register(self, spec: str, model: ChatModel) -> None:
        """Serve an already loaded model for ``spec`` (e.g. the trainer's model with its adapters)."""
        self._models[spec] = model

    def get(self, spec: str) -> ChatModel:
        if spec not in self._models:
            self._models[spec] = load_backend(spec, self.placement)
        return self._models[spec]


def llm_judge(model: ChatModel):
    """A judge for tau2's natural-language assertions from any chat backend: one greedy YES/NO per
    assertion about the transcript, all in one batched call."""

    def judge(assertions, transcript: str) -> list[bool]:
        prompts = [
            [
                Message(
                    role="system", content="You judge whether a customer-service conversation satisfies an assertion. Answer YES or NO."
                ),
                Message(role="user", content=f"Conversation:\n{transcript}\n\nAssertion: {a}\n\nIs the assertion true? Answer YES or NO."),
            ]
            for a in assertions
        ]
        replies = model.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=4)) if prompts else []
        return [g.text.strip().upper().startswith("YES") for g in replies]

    return judge


class EnvironmentEntry(NamedTuple):
    config: type[BaseModel]
    """The ``env`` section's schema (a member of ``config.EnvConfig``)."""
    build: Callable[..., Environment]
    """``build(cfg, models: ModelCache | None) -> Environment``; a heavy environment imports itself inside."""


class SimulatorEntry(NamedTuple):
    config: type[BaseModel]
    """The ``simulator`` section's schema (a member of ``config.SimulatorConfig``)."""
    build: Callable[..., Simulator]
    """``build(cfg, models: ModelCache) -> Simulator``."""


ENVIRONMENTS: Registry[EnvironmentEntry] = Registry("environment", "@register_env(TheConfig) in scope_marl/assembly.py")
"""Environments by the ``name`` of their ``env`` section."""
SIMULATOR_MODES: Registry[SimulatorEntry] = Registry("simulator mode", "@register_simulator(TheConfig) in scope_marl/assembly.py")
"""Simulator builders by the ``mode`` of their ``simulator`` section."""


def _tag(config: type[BaseModel], key: str) -> str:
    """The one literal value of a section's discriminator field (``name: Literal["tau2"]`` -> ``"tau2"``)."""
    field = config.model_fields.get(key)
    values = typing.get_args(field.annotation) if field is not None else ()
    if len(values) != 1 or not isinstance(values[0], str):
        raise TypeError(f'{config.__name__} needs a `{key}: Literal["..."]` field to be registered by')
    return values[0]


def register_env(config: type[BaseModel]) -> Callable[[Callable[..., Environment]], Callable[..., Environment]]:
    """Decorator: the builder of the environment whose ``env`` section is ``config``, registered under
    that section's ``name``. The section must also be a member of ``config.EnvConfig`` to be loadable."""
    name = _tag(config, "name")

    def decorate(build: Callable[..., Environment]) -> Callable[..., Environment]:
        ENVIRONMENTS.add(name, EnvironmentEntry(config, build))
        return build

    return decorate


def register_simulator(config: type[BaseModel]) -> Callable[[Callable[..., Simulator]], Callable[..., Simulator]]:
    """Decorator: the builder of the simulator mode whose section is ``config``, registered under that
    section's ``mode``. The section must also be a member of ``config.SimulatorConfig`` to be loadable."""
    name = _tag(config, "mode")

    def decorate(build: Callable[..., Simulator]) -> Callable[..., Simulator]:
        SIMULATOR_MODES.add(name, SimulatorEntry(config, build))
        return build

    return decorate


def _entry(registry: Registry, cfg: BaseModel, key: str):
    entry = registry.get(getattr(cfg, key, None))
    if not isinstance(cfg, entry.config):
        raise TypeError(f"{registry.kind} {getattr(cfg, key)!r} is built from a {entry.config.__name__}, not a {type(cfg).__name__}")
    return entry


def build_env(cfg: EnvConfig, models: ModelCache | None = None) -> Environment:
    """The environment an ``env`` section names, by the builder registered under its ``name``."""
    return _entry(ENVIRONMENTS, cfg, "name").build(cfg, models)


@register_env(SayTheWordConfig)
def _say_the_word(cfg: SayTheWordConfig, models: ModelCache | None = None) -> Environment:
    return SayTheWord(num_tasks=cfg.num_tasks, max_exchanges=cfg.max_exchanges, agent_first=cfg.agent_first)


@register_env(P4GConfig)
def _p4g(cfg: P4GConfig, models: ModelCache | None = None) -> Environment:
    from scope_marl.envs.p4g import PersuasionForGood

    return PersuasionForGood(**cfg.model_dump(exclude={"name"}))


@register_env(Tau2Config)
def _tau2(cfg: Tau2Config, models: ModelCache | None = None) -> Environment:
    from scope_marl.envs.tau2 import Tau2

    judge = llm_judge((models or ModelCache()).get(cfg.judge)) if cfg.judge else None
    return Tau2(
        cfg.domain,
        max_steps=cfg.max_steps,
        max_errors=cfg.max_errors,
        judge=judge,
        simulator_reward=cfg.simulator_reward,
        malformed_call_penalty=cfg.malformed_call_penalty,
    )


@register_env(CoopConfig)
def _coop(cfg: CoopConfig, models: ModelCache | None = None) -> Environment:
    from scope_marl.envs.coop import Coop, Limits

    limits = Limits(seconds=cfg.test_timeout_s, memory_mb=cfg.test_memory_mb)
    return Coop(
        cfg.setting, cfg.tasks_dir, cfg.max_steps, cfg.tool_output_chars, cfg.partial_credit, cfg.merge, limits, cfg.runtime, cfg.network
    )


def attach_adapter(model: ChatModel, adapter: str | None) -> str | None:
    """A seat's adapter: a name the model already holds, or a saved adapter directory (peft layout, e.g.
    scope sft's RUN_DIR/adapter) loaded once under a name derived from its path."""
    if adapter is None or adapter in getattr(model, "adapters", []):
        return adapter
    path = Path(adapter).expanduser()
    if not (path / "adapter_config.json").is_file():
        if "/" in adapter or path.exists():
            raise ValueError(f"adapter {adapter!r} is not a saved adapter directory (no adapter_config.json there); check the path")
        return adapter  # a name the run adds later (a trainable simulator's), or the backend reports it
    if not hasattr(model, "add_adapter"):
        raise ValueError(
            f"adapter {adapter!r} needs a local transformers model (embedded or hf:PATH), not {getattr(model, 'name', model)!r}"
        )
    name = "file-" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    if name not in model.adapters:
        model.add_adapter(name, str(path))
    return name


def build_agent(cfg: AgentConfig, models: ModelCache) -> Seat:
    model = models.get(cfg.model)
    adapter = attach_adapter(model, cfg.adapter)
    return Seat(model=model, sampling=cfg.sampling, adapter=adapter, prompt_prefix=cfg.prompt_prefix, trainable=cfg.trainable)


def build_simulator(cfg: SimulatorConfig, models: ModelCache) -> Simulator:
    """One simulator (or a rotation / population of them) from its config section, by the builder
    registered under its ``mode``."""
    return _entry(SIMULATOR_MODES, cfg, "mode").build(cfg, models)


def _seat_model(cfg: LLMSimulatorFields, models: ModelCache) -> tuple[ChatModel, LLMSimulatorFields]:
    """An LLM simulator's model, and its section with the adapter resolved on it (see attach_adapter)."""
    model = models.get(cfg.model)
    if cfg.adapter is not None:
        cfg = cfg.model_copy(update={"adapter": attach_adapter(model, cfg.adapter)})
    return model, cfg


def _seated(simulator_class):
    """The builder of a simulator that is one seat: ``simulator_class(model, sampling, prompt_prefix, adapter)``."""

    def build(cfg: LLMSimulatorFields, models: ModelCache) -> Simulator:
        model, cfg = _seat_model(cfg, models)
        return simulator_class(model, cfg.sampling, cfg.prompt_prefix, cfg.adapter, simulator_id=cfg.id)

    return build


register_simulator(FrozenSimulatorConfig)(_seated(FrozenSimulator))
register_simulator(TrainableSimulatorConfig)(_seated(TrainableSimulator))


@register_simulator(PersonaGuidedConfig)
def _persona_guided(cfg: PersonaGuidedConfig, models: ModelCache) -> Simulator:
    frozen = _seated(FrozenSimulator)(cfg, models)
    guided = persona_guided(frozen, cfg.guidance or PERSONA_GUIDANCE)
    if cfg.id:
        guided.simulator_id = cfg.id
    return guided


@register_simulator(VerbalizedConfig)
def _verbalized(cfg: VerbalizedConfig, models: ModelCache) -> Simulator:
    from scope_marl.simulators.verbalized import VerbalizedSampling

    model, cfg = _seat_model(cfg, models)
    fields = "k method variant tail_threshold calls sampling prompt_prefix adapter max_retries constrained seed".split()
    return VerbalizedSampling(model, simulator_id=cfg.id, **{name: getattr(cfg, name) for name in fields})


@register_simulator(PoolSimulatorConfig)
def _population(cfg: PoolSimulatorConfig, models: ModelCache) -> Simulator:
    from scope_marl.simulators.pool import SimulatorPool
    from scope_marl.simulators.population import PopulationSimulator

    return PopulationSimulator(SimulatorPool.load(cfg.root), models.get(cfg.model), cfg.sampling, cfg.prompt_prefix, cfg.seed)


@register_simulator(RotationConfig)
def _rotation(cfg: RotationConfig, models: ModelCache) -> Simulator:
    return Rotation([build_simulator(m, models) for m in cfg.members], order=cfg.order, seed=cfg.seed)


def build_rollout(cfg: RolloutRunConfig, models: ModelCache | None = None) -> RolloutEngine:
    models = models or ModelCache(resolve_placement(cfg.hardware))
    return RolloutEngine(build_env(cfg.env, models), build_agent(cfg.agent, models), build_simulator(cfg.simulator, models), cfg.rollout)
