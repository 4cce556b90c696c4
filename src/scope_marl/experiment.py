"""A training run with its periodic evaluation: the one place where training and evaluation meet.

``scope_marl.training`` and ``scope_marl.evaluation`` are siblings that never import each other
(the layers contract in pyproject.toml checks it): the trainer asks for an ``Evaluator``, and this
module hands it the evaluation panel of the run's config. ``scope train`` and ``scope demo`` start
and resume runs through here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from scope_marl.config import TrainConfig, dump_config
from scope_marl.core import run_layout
from scope_marl.core.run_lock import LOCK_FILE, RunLock
from scope_marl.evaluation.evaluate import AgentUnderTest, evaluate_panel
from scope_marl.evaluation.panel import Panel
from scope_marl.evaluation.periodic import PanelEvaluator
from scope_marl.training.trainer import Trainer, check_new_run, read_run_config


def evaluator_for(cfg: TrainConfig) -> PanelEvaluator | None:
    """The periodic evaluation a config asks for (None when ``eval.every`` is 0)."""
    return PanelEvaluator(cfg) if cfg.eval.every else None


def start(cfg: TrainConfig, run_dir: str | Path) -> Trainer:
    """A new run in ``run_dir`` (refused when it already holds one, or another process holds it), its
    config saved beside it."""
    lock = RunLock(run_dir).acquire()
    try:
        check_new_run(run_dir)
        trainer = Trainer(cfg, run_dir, evaluator_for(cfg), lock)
    except BaseException:
        lock.release()
        raise
    dump_config(cfg, Path(run_dir) / run_layout.CONFIG)
    return trainer


def resume(run_dir: str | Path, log: Callable[[str], None] = print) -> Trainer:
    """Continue a run from its own saved config and its newest valid checkpoint (refused while another
    process holds the run); ``log`` receives a warning for every damaged file skipped on the way."""
    # A run that is still starting holds its lock before it writes its config: try the lock first.
    if not any((Path(run_dir) / name).exists() for name in (run_layout.CONFIG, LOCK_FILE)):
        raise FileNotFoundError(f"{run_dir} has no {run_layout.CONFIG}: is it a run directory written by scope train?")
    lock = RunLock(run_dir).acquire()
    try:
        cfg = read_run_config(run_dir)
        return Trainer(cfg, run_dir, evaluator_for(cfg), lock).restore(log)
    except BaseException:
        lock.release()
        raise


def evaluate_trainer(trainer: Trainer, panel: Panel, log: Callable[[str], None] = print) -> dict:
    """The trainer's current agent against any panel (e.g. the demo's held-out panel after training)."""
    agent = AgentUnderTest(trainer.agent_chat, trainer.agent_adapter, f"step {trainer.step}", trainer.models, trainer.step)
    return evaluate_panel(panel, agent, log=log)
