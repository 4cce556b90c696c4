"""Evaluation panels: named simulators the agent is measured against (schema in docs/formats.md).

A panel lists simulators (any backend and mode), the split to draw tasks from (test by default),
how many tasks each simulator plays and how many samples per task, and a seed. Simulators the agent
trained with are marked ``training: true``: they are still played and reported, but the held-out
aggregate leaves them out, because collapse is only visible against simulators the agent never saw.
Built-in panels ship with the package and are named by their file stem (``offline``, ``api``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from scope_marl.config import EnvConfig, P4GConfig, Section, SimulatorConfig, Split, load_named
from scope_marl.core.types import SamplingParams

BUILTIN_DIR = Path(__file__).parent / "panels"


class PanelSimulator(Section):
    id: str = Field(..., min_length=1, description="the name in tables (also the simulator_id in episodes)")
    training: bool = Field(False, description="used in training: reported, but excluded from the held-out aggregate")
    simulator: SimulatorConfig
    env: dict = Field(default_factory=dict, description="overrides of the panel's env fields for this simulator, e.g. {source: synthetic}")


class CoverageSettings(Section):
    clusters: int = Field(8, ge=2, description="KMeans clusters of the reference turns")
    encoder: str = Field("tfidf", description="tfidf, or sentence-transformers:MODEL when such a model is available locally")
    reference: str = Field(
        "env", pattern="^(env|pooled)$", description="env: the environment's human turns when it has them; pooled: the evaluated turns"
    )


class Panel(Section):
    name: str = "panel"
    env: EnvConfig = Field(default_factory=lambda: P4GConfig(name="p4g", max_exchanges=3, word_limit=30))
    split: Split = "test"
    tasks_per_simulator: int = Field(4, ge=1)
    samples_per_task: int = Field(2, ge=1, description="rollouts per task (pass^k up to this k)")
    seed: int = 0
    agent_sampling: SamplingParams = Field(default_factory=lambda: SamplingParams(temperature=0.7, top_p=0.95, max_new_tokens=32))
    max_concurrent: int = Field(32, ge=1)
    coverage: CoverageSettings = Field(default_factory=CoverageSettings)
    simulators: list[PanelSimulator] = Field(..., min_length=1)

    @model_validator(mode="after")
    def _distinct_ids(self) -> Panel:
        ids = [s.id for s in self.simulators]
        duplicated = sorted({i for i in ids if ids.count(i) > 1})
        if duplicated:
            raise ValueError(f"simulator ids must be distinct, repeated: {duplicated}")
        for i, s in enumerate(self.simulators):
            unknown = sorted(set(s.env) - set(type(self.env).model_fields))
            if unknown:
                raise ValueError(f"simulators.{i}.env: unknown field(s) {unknown}; allowed: {', '.join(type(self.env).model_fields)}")
        return self

    def with_training(self, ids: set[str]) -> Panel:
        """A copy with the given simulators marked as used in training."""
        return self.model_copy(
            update={"simulators": [s.model_copy(update={"training": s.training or s.id in ids}) for s in self.simulators]}
        )


def builtin_panels() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))


def load_panel(name_or_path: str | Path) -> Panel:
    """A panel from a YAML path, or a built-in one by name (``offline``, ``api``)."""
    return load_named(name_or_path, Panel, BUILTIN_DIR)
