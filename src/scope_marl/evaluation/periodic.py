"""Evaluation during training: the panel a run plays every ``eval.every`` steps, built from its config.

:class:`PanelEvaluator` is what the trainer's ``Evaluator`` protocol asks for; the experiment layer
hands it to the trainer, so training and evaluation never import each other. The panel is
``eval.panel`` (or the single ``eval.simulator``) played on the run's own environment, agent
sampling and seed, ``eval.tasks`` tasks of ``eval.split`` per simulator and ``eval.group_size``
samples each. Panel entries that are the training simulator (same id, or same settings) are marked
as training, so the held-out aggregate leaves them out.
"""

from __future__ import annotations

from collections.abc import Callable

from scope_marl.assembly import ModelCache
from scope_marl.backends import ChatModel
from scope_marl.config import ConfigError, TrainConfig, explain
from scope_marl.evaluation.evaluate import AgentUnderTest, compact, evaluate_panel
from scope_marl.evaluation.panel import Panel, load_panel


def run_panel(cfg: TrainConfig) -> Panel:
    """The panel periodic evaluation of a run plays, validated on the run's own environment."""
    from pydantic import ValidationError

    e = cfg.eval
    fields = {
        "env": cfg.env,
        "split": e.split,
        "tasks_per_simulator": e.tasks,
        "samples_per_task": e.group_size,
        "seed": cfg.seed,
        "agent_sampling": cfg.agent_sampling,
        "max_concurrent": cfg.rollout.max_concurrent,
    }
    fields = {k: v.model_dump(mode="json") if hasattr(v, "model_dump") else v for k, v in fields.items()}
    if e.panel is not None:
        data = {**load_panel(e.panel).model_dump(mode="json"), **fields}
    else:
        data = {
            "name": "heldout",
            "simulators": [{"id": getattr(e.simulator, "id", None) or "heldout", "simulator": e.simulator.model_dump(mode="json")}],
            **fields,
        }
    try:  # validated again on this run's env: a panel entry's env overrides must fit it
        panel = Panel.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"eval.panel {e.panel!r} does not fit this run's env ({cfg.env.name}):\n" + explain(err, Panel)) from None
    return panel.with_training(training_ids(panel, cfg.simulator))


def training_ids(panel: Panel, simulator) -> set[str]:
    """Panel entries that are the training simulator (or one of its rotation members): the same id,
    or the same settings under another id."""
    members = list(getattr(simulator, "members", [])) + [simulator]
    ids = {m.id for m in members if getattr(m, "id", None)}
    settings = [m.model_dump(exclude={"id"}) for m in members]
    return {s.id for s in panel.simulators if s.id in ids or s.simulator.model_dump(exclude={"id"}) in settings}


class PanelEvaluator:
    """Plays a run's evaluation panel; built when the run starts, so a bad ``eval.panel`` fails at once."""

    def __init__(self, cfg: TrainConfig, log: Callable[[str], None] = lambda _: None):
        self.panel = run_panel(cfg)
        self.spec = cfg.model
        self.log = log

    def evaluate(self, chat: ChatModel, adapter: str | None, models: ModelCache, step: int, executor=None) -> dict:
        agent = AgentUnderTest(chat, adapter, f"step {step}", models, step, self.spec)
        return evaluate_panel(self.panel, agent, log=self.log, executor=executor)

    def metrics(self, results: dict) -> dict:
        return compact(results)
