"""Runs from a config: rollouts (``scope rollout``), and a training run with its periodic evaluation,
the one place where training and evaluation meet.

``scope_marl.training`` and ``scope_marl.evaluation`` are siblings that never import each other
(the layers contract in pyproject.toml checks it): the trainer asks for an ``Evaluator``, and this
module hands it the evaluation panel of the run's config. ``scope train`` and ``scope demo`` start
and resume runs through here.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path

from scope_marl.assembly import build_env, build_rollout
from scope_marl.config import RolloutRunConfig, TrainConfig, dump_config
from scope_marl.config.loading import saved_config
from scope_marl.core import run_layout
from scope_marl.evaluation.evaluate import AgentUnderTest, evaluate_panel
from scope_marl.evaluation.panel import Panel
from scope_marl.evaluation.periodic import PanelEvaluator
from scope_marl.executor import open_executor
from scope_marl.rollout import RolloutRecorder, summarize
from scope_marl.training import data_parallel
from scope_marl.training.config_edits import check_edits
from scope_marl.training.run_dir import RunDir
from scope_marl.training.trainer import Trainer


def play_rollouts(cfg: RolloutRunConfig, out: str | Path) -> tuple[list, dict, Path]:
    """``scope rollout``: play the config's tasks on its executor, write the batch (numbered after any
    already in ``out``), the config and ``summary.json``; returns (episodes, summary, batch path).

    On Ray the workers build their own engines; the simulator's batch figures are then not gathered."""
    recorder = RolloutRecorder(out)  # a bad --out fails before any model loads
    factory = functools.partial(build_rollout, cfg)
    executor = open_executor(cfg, factory)
    try:
        engine = getattr(executor, "engine", None)  # None on Ray: the engines are the workers'
        env = engine.env if engine is not None else build_env(cfg.env)
        simulator = engine.simulator if engine is not None else None
        tasks = env.tasks(cfg.split)[: cfg.num_tasks]
        dump_config(cfg, Path(out) / "config.yaml")
        started = time.perf_counter()
        episodes = executor.play(tasks, first_group=0)
        seconds = engine.stats.seconds if engine is not None else time.perf_counter() - started
        tokens = executor.generated_tokens
    finally:
        executor.close()
    path = recorder.write_batch(episodes)
    summary = summarize(episodes, seconds, tokens, simulator)
    summary["simulator"] = simulator.identity() if simulator is not None else episodes[0].metadata.get("simulator") if episodes else None
    summary.update(split=cfg.split, tasks=len(episodes) // cfg.rollout.group_size, batch_file=path.name, env=env.describe())
    recorder.write_summary(summary)
    return episodes, summary, path


def evaluator_for(cfg: TrainConfig) -> PanelEvaluator | None:
    """The periodic evaluation a config asks for (None when ``eval.every`` is 0)."""
    return PanelEvaluator(cfg) if cfg.eval.every else None


def start(cfg: TrainConfig, run_dir: str | Path) -> Trainer:
    """A new run in ``run_dir`` (refused when it already holds one, or another process holds it), its
    config saved beside it."""
    # Under torchrun only rank 0 holds the lock and writes.
    return RunDir.start(run_dir, cfg, lambda run: _trainer(cfg, run), lead=data_parallel.rank() == 0)


def resume(run_dir: str | Path, log: Callable[[str], None] = print) -> Trainer:
    """Continue a run from its own saved config and its newest valid checkpoint (refused while another
    process holds the run); ``log`` receives a warning for every damaged file skipped on the way."""
    run, cfg = _open_existing(run_dir)
    return _restored(run, cfg, log)


def _open_existing(run_dir: str | Path) -> tuple[RunDir, TrainConfig]:
    """A started run, locked (by the lead rank under torchrun), and the config it was started with."""
    run = RunDir.existing(run_dir, lead=data_parallel.rank() == 0)
    with run.released_on_error():
        return run, run.read_config(TrainConfig)


def _trainer(cfg: TrainConfig, run: RunDir) -> Trainer:
    """A trainer wired to the evaluation layer: its periodic panel, and the report's figures for its trackers."""
    trainer = Trainer(cfg, run, evaluator_for(cfg))
    trainer.figures = run_figures
    return trainer


def run_figures(run_dir: Path) -> list[Path]:
    """A finished run's report figures (what ``scope report RUN_DIR --out RUN_DIR/report`` writes)."""
    from scope_marl.evaluation.report import write_report

    out = write_report([run_dir], Path(run_dir) / run_layout.REPORT).parent
    return [p for p in (out / "collapse.png", out / "heldout.png") if p.is_file()]


def _restored(run: RunDir, cfg: TrainConfig, log: Callable[[str], None]) -> Trainer:
    with run.released_on_error():
        edits = _config_edits(run, cfg, log)  # before any model is built: a refused edit is about the config
        trainer = _trainer(cfg, run).restore(log)
        trainer.config_edits = edits
        return trainer


def _config_edits(run: RunDir, cfg: TrainConfig, log: Callable[[str], None]) -> dict[str, list]:
    """config.yaml against the config the newest checkpoint ran with: the edits a resume applies
    (logged), or ConfigEditRefused naming the fields it cannot change."""
    saved = run_layout.list_checkpoints(run.path)
    if not saved:
        return {}
    state = run_layout.read_state(saved[-1])
    before = state.get("config")
    if before is not None:  # read as this release reads it: fields added since get their defaults, renamed ones their meaning
        before = saved_config(before, TrainConfig, f"{saved[-1]}/{run_layout.STATE}").model_dump(mode="json")
    edits = check_edits(before, cfg.model_dump(mode="json"), state["step"], str(run.path))
    for field, (old, new) in edits.items():
        log(
            f"config.yaml changed since step {state['step']}: {field} {old!r} -> {new!r} (applied from the next step, recorded in its metrics)"
        )
    return edits


def train(
    cfg: TrainConfig | None,
    run_dir: str | Path,
    log: Callable[[str], None] = print,
    progress: bool = True,
    on_step: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Start (``cfg`` given) or resume (``cfg`` None) a run and train it to its last step; the records of
    the steps played (``on_step`` gets each as it is done). With ``executor: ray`` the trainer runs as a learner actor on the Ray cluster;
    launched by torchrun, this process is one data-parallel rank (``training.data_parallel``)."""
    data_parallel.join_from_environment()  # under torchrun: one rank of a data-parallel run
    if cfg is not None:
        if cfg.executor == "ray":
            return _train_on_ray(cfg, cfg.ray, run_dir, log, progress, on_step)
        trainer = start(cfg, run_dir)
    else:
        run, saved = _open_existing(run_dir)
        if saved.executor == "ray":
            run.release()  # the learner actor resumes the run in its own process
            return _train_on_ray(None, saved.ray, run_dir, log, progress, on_step)
        trainer = _restored(run, saved, log)
    if trainer.lead:
        log(trainer.placement.describe() + (" (agent sharded with FSDP2)" if trainer.sharded else ""))
    return trainer.run(progress, on_step)


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

    def next_step(self) -> dict:
        return self.trainer.next_step()  # sync or async, as the config says

    def finish(self) -> None:
        self.trainer.finish()

    def close(self) -> None:
        self.trainer.close()


def _train_on_ray(
    cfg: TrainConfig | None, settings, run_dir: str | Path, log: Callable[[str], None], progress: bool, on_step=None
) -> list[dict]:
    from tqdm.auto import tqdm

    from scope_marl.executor.ray_workers import connect, raised_cause

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
                    record = ray.get(actor.next_step.remote())
                    records.append(record)
                    if on_step is not None:
                        on_step(record)
                    bar.update(1)
                    bar.set_postfix(reward=f"{record.get('reward_agent', {}).get('mean', float('nan')):.3f}")
        except ray.exceptions.RayTaskError as err:
            raise raised_cause(ray, err) from None
        ray.get(actor.finish.remote())  # the run's figures to the trackers, as a local run ends
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
