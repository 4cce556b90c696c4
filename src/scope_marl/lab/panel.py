"""Panels of lab simulators from YAML: the built-in ``heldout`` and ``validation`` panels, or your own.

Schema (documented with examples in docs/lab.md)::

    name: my-panel                 # optional, for reports
    simulators:                    # at least one; ids unique
      - id: human                  # required (the evaluation panels of scope eval name it id too)
        gamma: 1.0                 # > 0; 1 = the human reply model, larger = more collapsed
        adherence: 1.0             # in [0, 1]; share of episodes played as the persona given
        personas: population       # population | modal | minority | [names] | {name: weight}
        vs:                        # optional: the simulator answers through Verbalized Sampling
          method: prob             # prob | random
          k: 5                     # optional, default: the game's k
          noise: 0.3               # log-normal noise of stated probabilities
          residual: 0.333          # share of the excess gamma left when verbalizing

``personas`` says which users the panel member is asked to play (the task distribution);
``population`` uses the game's persona shares, ``minority`` every persona but the modal one (in
proportion to their shares). Names are checked against the game when the panel is built, so one
file can serve both games when it uses only the generic values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from pydantic import Field, field_validator

from scope_marl.config import ConfigError, Section, load_named
from scope_marl.lab.games import Game
from scope_marl.lab.simulators import VS_NOISE, VS_RESIDUAL, ActSimulator, FrozenActs, VerbalizedActs

BUILTIN_DIR = Path(__file__).parent / "panels"
HELDOUT_PANEL = "heldout"  # never used to choose anything
VALIDATION_PANEL = "validation"  # the only panel hyperparameters are tuned on

FIXES = {
    "id": "give every simulator a short unique id, e.g. id: llm-a",
    "gamma": "use a number > 0 (1 = the human model; 2-6 = increasingly collapsed LLMs)",
    "adherence": "use a number between 0 (always plays the modal persona) and 1 (always keeps its persona)",
    "personas": "use population, modal, minority, a list of persona names, or a mapping name: weight",
    "method": "use prob or random",
    "k": "use a whole number >= 1 (at most the game's number of acts)",
    "noise": "use a number >= 0 (0 = exactly calibrated stated probabilities)",
    "residual": "use a number between 0 (VS fully undoes collapse) and 1 (VS changes nothing)",
    "simulators": "list at least one simulator under simulators:",
}


class PanelError(ConfigError):
    """A panel that does not fit the game it is played on; the message names the field and the fix."""


class VSSpec(Section):
    method: Literal["prob", "random"] = "prob"
    k: int | None = Field(None, ge=1)
    noise: float = Field(VS_NOISE, ge=0.0)
    residual: float = Field(VS_RESIDUAL, ge=0.0, le=1.0)


class PanelSimulator(Section):
    id: str = Field(min_length=1)
    gamma: float = Field(1.0, gt=0.0)
    adherence: float = Field(1.0, ge=0.0, le=1.0)
    personas: Literal["population", "modal", "minority"] | list[str] | dict[str, float] = "population"
    vs: VSSpec | None = None

    @field_validator("personas")
    @classmethod
    def _non_empty(cls, value):
        if isinstance(value, (list, dict)) and not value:
            raise ValueError("is empty")
        if isinstance(value, dict) and (any(w < 0 for w in value.values()) or not sum(value.values()) > 0):
            raise ValueError("weights must be >= 0 with a positive sum")
        return value


class Panel(Section):
    name: str = "panel"
    simulators: list[PanelSimulator] = Field(min_length=1)

    @field_validator("simulators")
    @classmethod
    def _unique(cls, value):
        ids = [s.id for s in value]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"duplicate simulator ids {duplicates}")
        return value


def load_panel(name_or_path: str | Path) -> Panel:
    """A panel YAML file, or a built-in panel by name (``heldout``, ``validation``); errors name the field and the fix."""
    return load_named(name_or_path, Panel, BUILTIN_DIR, kind="lab panel", fixes=FIXES)


def persona_weights(game: Game, spec: PanelSimulator, where: str) -> torch.Tensor:
    """The distribution over personas a panel member is asked to play."""
    personas = spec.personas
    weights = torch.zeros(len(game.personas))
    if personas == "population":
        return game.weights.clone()
    if personas == "modal":
        weights[game.modal_persona] = 1.0
        return weights
    if personas == "minority":
        weights = game.weights.clone()
        weights[game.modal_persona] = 0.0
        return weights / weights.sum()
    # A list keeps the population's shares among the listed personas; a mapping sets its own.
    items = list(personas.items()) if isinstance(personas, dict) else [(name, None) for name in personas]
    for name, weight in items:
        if name not in game.personas:
            raise PanelError(
                f"{where}.personas: unknown persona {name!r} for game {game.name}. "
                f"Fix: use one of {list(game.personas)}, or population / modal / minority"
            )
        index = game.persona_index(name)
        weights[index] = game.weights[index] if weight is None else weight
    if not weights.sum() > 0:
        raise PanelError(f"{where}.personas: the listed personas have no weight. Fix: {FIXES['personas']}")
    return weights / weights.sum()


def build_panel(game: Game, panel: Panel) -> list[tuple[str, ActSimulator, torch.Tensor]]:
    """(id, simulator, persona weights) for every panel member, for this game."""
    members = []
    for i, spec in enumerate(panel.simulators):
        where = f"simulators[{i}]"
        simulator: ActSimulator = FrozenActs.sharpened(game, spec.gamma, spec.adherence, simulator_id=spec.id)
        if spec.vs is not None:
            if spec.vs.k is not None and spec.vs.k > len(game.acts):
                raise PanelError(f"{where}.vs.k: {spec.vs.k} is more than the {len(game.acts)} acts of game {game.name}. Fix: {FIXES['k']}")
            simulator = VerbalizedActs(simulator, spec.vs.k, spec.vs.method, spec.vs.noise, spec.vs.residual, simulator_id=spec.id)
        members.append((spec.id, simulator, persona_weights(game, spec, where)))
    return members
