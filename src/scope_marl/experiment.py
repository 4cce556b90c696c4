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
from scope_marl.training import data_parallel
from scope_marl.training.trainer import Trainer, check_new_run, read_run_config


def evaluator_for(cfg: TrainConfig) -> PanelEvaluator | None:
    """The periodic evaluation a config asks for (None when ``eval.every`` is 0)."""
    return PanelEvaluator(cfg) if cfg.eval.every else None


def start(cfg: TrainConfig, run_dir: str | Path) -> Trainer:
    """A new run in ``run_dir`` (refused when it already holds one, or another process holds it), its
    config saved beside it."""
    lead = data_parallel.rank() == 0  # under torchrun only rank 0 holds the lock and writes
    lock = RunLock(run_dir).acquire() if lead else None
    try:
        check_new_run(run_dir)
        trainer = Trainer(cfg, run_dir, evaluator_for(cfg), lock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    if lead:
        dump_config(cfg, Path(run_dir) / run_layout.CONFIG)
    return trainer


def resume(run_dir: str | Path, log: Callable[[str], None] = print) -> Trainer:
    """Continue a run from its own saved config and its newest valid checkpoint (refused while another
    process holds the run); ``log`` receives a warning for every damaged file skipped on the way."""
    # A run that is still starting holds its lock before it writes its config: try the lock first.
    if not any((Path(run_dir) / name).exists() for name in (run_layout.CONFIG, LOCK_FILE)):
        raise FileNotFoundError(f"{run_dir} has no {run_layout.CONFIG}: is it a run directory written by scope train?")
    lock = RunLock(run_dir).acquire() if data_parallel.rank() == 0 else None
    try:
        cfg = read_run_config(run_dir)
        return Trainer(cfg, run_dir, evaluator_for(cfg), lock).restore(log)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def train(cfg: TrainConfig | None, run_dir: str | Path, log: Callable[[str], None] = print, progress: bool = True) -> list[dict]:
    """Start (``cfg`` given) or resume (``cfg`` None) a run and train it to its last step; the records of
    the steps played. With ``executor: ray`` the trainer runs as a learner actor on the Ray cluster;
    launched by torchrun, this process is one data-parallel rank (``training.data_parallel``)."""
    data_parallel.join_from_environment()  # under torchrun: one rank of a data-parallel run
    saved = Path(run_dir) / run_layout.CONFIG
    executor = cfg.executor if cfg is not None else read_run_config(run_dir).executor if saved.exists() else "local"
    if executor == "ray":
        return _train_on_ray(cfg, run_dir, log, progress)
    trainer = start(cfg, run_dir) if cfg is not None else resume(run_dir, log)
    if trainer.lead:
        log(trainer.placement.describe() + (" (agent sharded with FSDP2)" if trainer.sharded else ""))
    return trainer.run(progress)


class _LearnerActor:
    """The trainer as a Ray actor: it reserves no CPU (``num_cpus=0``), so the rollout workers it
    starts get every core; ``ray.learner_gpus`` gives it GPUs on a cluster that has them. It writes the
    run directory itself (local disk, or storage the cluster shares)."""

    def open(self, cfg: TrainConfig | None, run_dir: str) -> tuple[int, int, list[str]]:
        """Start or resume the run (a method, not the constructor, so its errors reach the caller as
        they are); returns (step, steps, warnings met on the way)."""
        warnings: list[str] = []
        self.trainer = start(cfg, run_dir) if cfg is not None else resume(run_dir, warnings.append)
        return self.trainer.step, self.trainer.cfg.steps, warnings

    def train_step(self) -> dict:
        return self.trainer.train_step()

    def close(self) -> None:
        self.trainer.close()


def _train_on_ray(cfg: TrainConfig | None, run_dir: str | Path, log: Callable[[str], None], progress: bool) -> list[dict]:
    from tqdm.auto import tqdm

    from scope_marl.executor import connect, raised_cause

    settings = (cfg or read_run_config(run_dir)).ray
    ray, started = connect(settings.address)
    actor = None
    try:
        learner = ray.remote(num_cpus=0, num_gpus=settings.learner_gpus, max_restarts=0)(_LearnerActor)
        actor = learner.remote()
        records = []
        try:
            step, steps, warnings = ray.get(actor.open.remote(cfg, str(Path(run_dir).resolve())))
            for message in warnings:
                log(message)
            with tqdm(total=steps, initial=step, desc="train", unit="step", disable=not progress) as bar:
                for _ in range(step, steps):
                    record = ray.get(actor.train_step.remote())
                    records.append(record)
                    bar.update(1)
                    bar.set_postfix(reward=f"{record.get('reward_agent', {}).get('mean', float('nan')):.3f}")
        except ray.exceptions.RayTaskError as err:
            raise raised_cause(ray, err) from None
        ray.get(actor.close.remote())
        return records
    finally:
        if actor is not None:
            ray.kill(actor)  # its process ends: the run's lock goes with it
        if started:
            ray.shutdown()


def evaluate_trainer(trainer: Trainer, panel: Panel, log: Callable[[str], None] = print) -> dict:
    """The trainer's current agent against any panel (e.g. the demo's held-out panel after training)."""
    agent = AgentUnderTest(
        trainer.agent_chat, trainer.agent_adapter, f"step {trainer.step}", trainer.models, trainer.step, trainer.cfg.model
    )
    return evaluate_panel(panel, agent, log=log)
