"""Experiment configuration: pydantic schemas loaded from YAML, with errors that name the field.

``loading`` reads YAML and explains errors; ``env``, ``simulator``, ``rollout`` and ``train`` hold
the schemas of each section. Everything is re-exported here, so ``from scope_marl.config import
TrainConfig`` is the usual import.
"""

from scope_marl.config.env import ENV_CONFIGS, CoopConfig, EnvConfig, P4GConfig, SayTheWordConfig, Split, Tau2Config
from scope_marl.config.hardware import HardwareSettings
from scope_marl.config.loading import ConfigError, Section, dump_config, explain, load_config, load_named, load_saved_config, validate
from scope_marl.config.rollout import AgentConfig, ExecutorSettings, RaySettings, RolloutConfig, RolloutRunConfig
from scope_marl.config.sft import SFTConfig
from scope_marl.config.simulator import (
    SIMULATOR_CONFIGS,
    FrozenSimulatorConfig,
    LLMSimulatorFields,
    MemberConfig,
    PersonaGuidedConfig,
    PoolSimulatorConfig,
    RotationConfig,
    SimulatorConfig,
    TrainableSimulatorConfig,
    VerbalizedConfig,
    default_sampling,
    parse_simulator_spec,
)
from scope_marl.config.train import Aggregation, Baseline, EvalSettings, LearnerConfig, LoraSettings, PoolSettings, TrainConfig

__all__ = [
    "ENV_CONFIGS",
    "SIMULATOR_CONFIGS",
    "AgentConfig",
    "Aggregation",
    "Baseline",
    "ConfigError",
    "CoopConfig",
    "EnvConfig",
    "EvalSettings",
    "ExecutorSettings",
    "FrozenSimulatorConfig",
    "HardwareSettings",
    "LLMSimulatorFields",
    "LearnerConfig",
    "LoraSettings",
    "MemberConfig",
    "P4GConfig",
    "PersonaGuidedConfig",
    "PoolSettings",
    "PoolSimulatorConfig",
    "RaySettings",
    "RolloutConfig",
    "RolloutRunConfig",
    "RotationConfig",
    "SFTConfig",
    "SayTheWordConfig",
    "Section",
    "SimulatorConfig",
    "Split",
    "Tau2Config",
    "TrainConfig",
    "TrainableSimulatorConfig",
    "VerbalizedConfig",
    "default_sampling",
    "dump_config",
    "explain",
    "load_config",
    "load_named",
    "load_saved_config",
    "parse_simulator_spec",
    "validate",
]
