"""The training loop: rollout -> per-role learner updates -> pool / evaluation / checkpoint, step by step.

Each step reads the next ``tasks_per_step`` training tasks from a cursor (a seeded shuffle per pass
over the split), has the run's executor play ``group_size`` rollouts per task, and updates each role
in ``trainable_roles`` on its own streams and reward. What the run plays and trains with is built by
:mod:`scope_marl.training.policies`; where it plays is the executor's business
(:mod:`scope_marl.executor`); population co-training's pool is :mod:`scope_marl.training.population`;
the run directory (lock, config, metrics, checkpoints, trimming on resume) is
:class:`~scope_marl.training.run_dir.RunDir`. Every ``eval.every`` steps an :class:`Evaluator`
(supplied by the caller: :mod:`scope_marl.experiment` wires in :mod:`scope_marl.evaluation`, which
training never imports) plays the agent against held-out simulators with its own engines, so it never
moves the training cursor or the engine's counters.
"""

from __future__ import annotations

import functools
import random
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch

from scope_marl.assembly import ModelCache
from scope_marl.backends.hf import HFChatModel
from scope_marl.backends.placement import resolve_placement
from scope_marl.config import TrainConfig
from scope_marl.core import files, run_layout
from scope_marl.core.machine import ThreadGovernor
from scope_marl.core.seeds import shuffled_position
from scope_marl.envs import AGENT, USER
from scope_marl.executor import open_executor
from scope_marl.executor.base import Replayed
from scope_marl.rollout import RolloutRecorder, summarize
from scope_marl.training import checkpoint, data_parallel, sharding
from scope_marl.training.learner import Learner
from scope_marl.training.policies import ADAPTERS, build_policies, worker_engine
from scope_marl.training.population import Population
from scope_marl.training.run_dir import RunDir
from scope_marl.training.trackers import Trackers


class Evaluator(Protocol):
    """Periodic evaluation during training, as the trainer sees it."""

    def evaluate(self, chat: HFChatModel, adapter: str | None, models: ModelCache, step: int, executor=None) -> dict:
        """Play the agent (``adapter`` on ``chat``; None: the model itself) and return the full results
        (written to ``evals/step-N.json``), as jobs on the run's ``executor``."""

    def metrics(self, results: dict) -> dict:
        """The part of ``results`` that goes into the step's metrics line. Its ``reward_agent`` (the
        held-out mean reward) picks the best checkpoint."""


class Trainer:
    """Holds its run directory (:class:`RunDir`, locked) from construction until :meth:`run` ends or
    :meth:`close` is called, so no second process can train into the same directory meanwhile."""

    def __init__(self, cfg: TrainConfig, run: RunDir | str | Path, evaluator: Evaluator | None = None):
        if cfg.eval.every and evaluator is None:
            raise ValueError(
                "eval.every is set but no evaluator was given: start runs with scope_marl.experiment.start "
                "or .resume (they wire in the evaluation panel), or set eval.every: 0"
            )
        # Data-parallel (torchrun): every rank trains, rank 0 ("the lead") alone writes the run directory.
        self.rank, self.world = data_parallel.rank(), data_parallel.world()
        self.lead = self.rank == 0
        if self.world > 1 and cfg.executor == "ray":
            raise ValueError(
                "data-parallel ranks (torchrun) each play their own groups: use executor: local with torchrun, or Ray without it"
            )
        if self.world > 1 and cfg.trainer.mode == "async":
            raise ValueError("trainer.mode: async runs one generator process for one learner: train without torchrun, or use mode: sync")
        if self.world > 1 and cfg.sampler is not None:
            # Every rank would save its adapters into the same run directory for the server to read.
            raise ValueError("a sampler server takes adapters from one process: train with a sampler without torchrun")
        self.dir = run if isinstance(run, RunDir) else RunDir(run, lead=self.lead)
        self.dir.acquire()
        self.run_dir = self.dir.path
        self.evaluator = evaluator
        self.cfg = cfg
        self.config_edits: dict[str, list] = {}  # config.yaml edits a resume applied: recorded in the next step's metrics
        # Threads: the config's, else the cores other processes leave free, checked again every step.
        self.threads = ThreadGovernor(cfg.threads)
        self.threads.adjust()
        if cfg.deterministic:
            torch.use_deterministic_algorithms(True)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)

        self.placement = resolve_placement(cfg.hardware)
        models = ModelCache(self.placement)
        self.chat, self.agent_chat, self.engine = build_policies(cfg, models)
        self.sharded = sharding.is_sharded(self.agent_chat.model)
        self.full = cfg.finetune == "full"
        self.agent_adapter = None if self.full else ADAPTERS[AGENT]
        self.env, self.simulator = self.engine.env, self.engine.simulator
        if cfg.task_ids is not None:
            self.train_tasks()  # unknown task ids fail when the run starts, not at its first step
        self.learners = {}
        for role in cfg.trainable_roles:
            learner = cfg.learner if role == AGENT or cfg.simulator_learner is None else cfg.simulator_learner
            temperature = cfg.agent_sampling.temperature if role == AGENT else cfg.simulator.sampling.temperature
            if role == AGENT and self.full:
                self.learners[role] = Learner(self.agent_chat, role, None, temperature, learner, reference=self.chat)
            else:
                self.learners[role] = Learner(self.chat, role, ADAPTERS[role], temperature, learner)
            self.learners[role].threads = self.threads
        self.engine.threads = self.threads  # re-checked inside long rollouts and updates too
        self.models = models
        # Where the groups are played (this process, Ray workers, data-parallel ranks, a sampler server);
        # adapters changed since the last rollout are pushed to it before the next, tagged with the step.
        self._unsynced = self._run_adapters()
        self.executor = open_executor(
            cfg,
            functools.partial(worker_engine, cfg),
            engine=self.engine,
            ranks=data_parallel,
            sampler_folder=self.run_dir / run_layout.SAMPLER_ADAPTERS,
        )
        self.recorder = RolloutRecorder(self.dir.rollouts)
        self.trackers = Trackers(cfg, self.run_dir, enabled=self.lead)
        # The run's figures for the trackers once the last step is trained (experiment.py hands in the report's).
        self.figures: Callable[[Path], list[Path]] | None = None
        self.population = (
            Population(cfg.pool, cfg.seed, self.run_dir, self.chat, ADAPTERS[USER], self.engine, self.lead)
            if cfg.pool is not None
            else None
        )
        self.step = 0
        self.cursor = 0
        # async: batches queued on the generator and not yet trained, as (task cursor, first group) before each,
        # and the pool member it plays (None without a pool)
        self._in_flight: deque[tuple[int, int, Replayed | None]] = deque()
        self._lost_in_flight = 0  # set by a resume: batches played ahead but never trained, played again
        self.best: tuple[float, str] | None = None

    @property
    def metrics_path(self) -> Path:
        return self.dir.metrics_path

    # ---- data --------------------------------------------------------------------------------
    def train_tasks(self) -> list:
        """The train split, or the tasks of it that ``task_ids`` names (in the split's order)."""
        tasks = self.env.tasks("train")
        if self.cfg.task_ids is None:
            return tasks
        known = {t.task_id for t in tasks}
        missing = [i for i in self.cfg.task_ids if i not in known]
        if missing:
            raise ValueError(f"task_ids {missing} are not in the train split ({len(tasks)} tasks, e.g. {', '.join(sorted(known)[:5])})")
        wanted = set(self.cfg.task_ids)
        return [t for t in tasks if t.task_id in wanted]

    def next_tasks(self):
        """The next ``tasks_per_step`` training tasks: a seeded shuffle of the split per pass."""
        tasks = self.train_tasks()
        out = []
        for _ in range(self.cfg.tasks_per_step):
            out.append(tasks[shuffled_position(self.cursor, len(tasks), self.cfg.seed)])
            self.cursor += 1
        return out

    # ---- one step ----------------------------------------------------------------------------
    def next_step(self) -> dict:
        """The next step in the config's mode: :meth:`async_step` (``trainer.mode: async``) or :meth:`train_step`."""
        return self.async_step() if self.cfg.trainer.mode == "async" else self.train_step()

    def train_step(self) -> dict:
        """One synchronous step: play a batch with the current weights, then update on it."""
        self.threads.adjust()
        started = time.perf_counter()
        if self.population is not None:
            self.population.draw(self.step)
            self._unsynced.add(ADAPTERS[USER])
        episodes = self._play(self.next_tasks())
        return self._learn(episodes, time.perf_counter() - started)

    def async_step(self) -> dict:
        """One asynchronous step (``trainer.mode: async``): keep up to ``max_staleness + 1`` batches queued
        on the generator, each admitted only with weights at most ``max_staleness`` versions older than the
        step it will be trained at, then update on the oldest as soon as it is played (docs/async.md)."""
        self.threads.adjust()
        k = self.cfg.trainer.max_staleness
        while len(self._in_flight) <= k and self.step + len(self._in_flight) < self.cfg.steps:
            self._push_unsynced()  # the weights before the first batch, or after a resume
            cursor, first = self.cursor, self.engine.state_dict()["groups"]
            tasks = self.next_tasks()
            # A pool member goes with its batch, drawn as the synchronous step would draw it (from the pool as it is now).
            replayed = self.population.choose(self.step + len(self._in_flight)) if self.population is not None else None
            self.executor.submit(tasks, first, min_version=self.step + len(self._in_flight) - k, replayed=replayed)
            self.engine.load_state_dict({"groups": first + len(tasks)})
            self._in_flight.append((cursor, first, replayed))
        started = time.perf_counter()
        episodes, played = self.executor.collect()
        replayed = self._in_flight.popleft()[2]
        if replayed is not None:
            self.population.load(replayed)  # the simulator learner starts from the member that played, as in a sync step
        record = self._learn(
            episodes,
            time.perf_counter() - started,
            {"in_flight": len(self._in_flight), "generate_s": played["generate_s"], "generator_idle_s": played["idle_s"]},
            replayed=replayed is not None,
        )
        if replayed is not None:
            self._unsynced.discard(ADAPTERS[USER])  # every batch carries its own member: the trained simulator is only snapshotted
        # The update's weights go out at once (the generator's next batch may use them), and the version with them even
        # when nothing changed that plays (a pool run training the simulator only): later batches wait for it.
        self._push_unsynced(advance=True)
        return record

    def _learn(self, episodes: list, rollout_s: float, asynchronous: dict | None = None, replayed: bool = False) -> dict:
        """Record a played batch, update every trained role on it, evaluate and checkpoint when due
        (``replayed``: a pool member played the simulator and the simulator learner now starts from it)."""
        for e in episodes:  # the policy versions (updates applied) that played it, per trained role
            e.metadata["versions"] = dict.fromkeys(self.learners, e.metadata.pop("behaviour_version", self.step))
            if replayed and USER in self.learners:  # the member that played is what the simulator learner holds: no lag
                e.metadata["versions"][USER] = self.step
        if self.lead:
            self.recorder.write_batch(episodes)
        self.step += 1
        summary = summarize(episodes, rollout_s, 0)
        record: dict = {
            "step": self.step,
            "rollout_s": rollout_s,
            "episodes": len(episodes),
            "status": summary["status"],
            "generated_tokens": sum(s.num_sampled_tokens for e in episodes for s in e.streams.values()),
        }
        if asynchronous is not None:
            record["async"] = asynchronous  # rollout_s is then the learner's wait for the batch
        for role, stats in summary["rewards"].items():
            record[f"reward_{role}"] = {"mean": stats["mean"], "std": stats["std"]}
        reported = self.engine.simulator.batch_metrics(episodes)
        if reported:
            record["simulator"] = reported
        if self.population is not None:
            self.population.record(record)
        if self.config_edits:
            record["config_edits"], self.config_edits = self.config_edits, {}
        update_started = time.perf_counter()
        for role, learner in self.learners.items():
            record[f"train_{role}"] = learner.step(episodes)  # under data parallelism each rank trains on its groups
            # Versions the learner's weights are ahead of the ones that played (0 in sync mode: it played this step).
            lags = [self.step - 1 - e.metadata["versions"][role] for e in episodes]
            record[f"train_{role}"]["staleness_mean"] = sum(lags) / max(len(lags), 1)
            self._unsynced.add(ADAPTERS[role])
        record["update_s"] = time.perf_counter() - update_started
        if self.population is not None:
            self.population.after_update(self.step)
        if self.cfg.eval.every and self.step % self.cfg.eval.every == 0:
            with sharding.gathered(self.agent_chat.model):  # every rank gathers a sharded agent; the lead plays it
                if self.lead:
                    results = self.evaluator.evaluate(self.agent_chat, self.agent_adapter, self.models, self.step, executor=self.executor)
                    files.write_json(run_layout.eval_path(self.run_dir, self.step), results)
                    record["eval"] = self.evaluator.metrics(results)
        if not self.lead:
            if self.sharded and data_parallel.broadcast(None):  # the lead decides; every rank writes its shard
                self.save()
            return record
        self.dir.append_metrics(record)
        self.trackers.log_step(record, episodes)
        held_out = record.get("eval", {}).get("reward_agent")
        save = False
        if held_out is not None and (self.best is None or held_out > self.best[0]):
            # The best held-out agent so far gets a checkpoint of its own, kept beside the last N.
            # Stored as the folder name, so a moved run or a resume from another directory still finds it.
            self.best = (held_out, run_layout.checkpoint_dir(self.run_dir, self.step).name)
            save = True
        elif self.step % self.cfg.checkpoint_every == 0 or self.step == self.cfg.steps:
            save = True
        if self.sharded:
            data_parallel.broadcast(save)
        if save:
            self.save()
        return record

    def _run_adapters(self) -> set[str]:
        """The run's adapters on the base (the ones the Ray workers' factory adds)."""
        return {name for name in ADAPTERS.values() if name in self.chat.adapters}

    def _push_unsynced(self, advance: bool = False) -> None:
        """Send the adapters changed since the last push to where the plays run, tagged with the step
        (and, with a pool, the member now playing in the simulator's adapter); ``advance``: send the
        step's version even with no adapter changed."""
        if self._unsynced or advance:
            simulator_id = self.engine.simulator.simulator_id if self.population is not None else None
            self.executor.push(self.chat, sorted(self._unsynced), version=self.step, simulator_id=simulator_id)
            self._unsynced.clear()

    def _play(self, tasks) -> list:
        """One step's groups, on the run's executor, under the numbers the local engine would give them
        (so every executor samples the same episodes)."""
        self._push_unsynced()
        with sharding.gathered(self.agent_chat.model):  # a sharded agent plays with its whole weights on every rank
            first = self.engine.state_dict()["groups"]
            episodes = self.executor.play(tasks, first_group=first)
            self.engine.load_state_dict({"groups": first + len(tasks)})  # the groups played elsewhere are counted here
        return episodes

    def run(self, progress: bool = True, on_step: Callable[[dict], None] | None = None) -> list[dict]:
        """Train to the last step (then release the run directory); ``on_step`` gets each step's record."""
        from tqdm.auto import tqdm

        records = []
        try:
            with tqdm(total=self.cfg.steps, initial=self.step, desc="train", unit="step", disable=not (progress and self.lead)) as bar:
                while self.step < self.cfg.steps:
                    record = self.next_step()
                    records.append(record)
                    if on_step is not None:
                        on_step(record)
                    bar.update(1)
                    bar.set_postfix(reward=f"{record.get('reward_agent', {}).get('mean', float('nan')):.3f}")
            self.finish()
        finally:
            self.close()
        return records

    def finish(self) -> None:
        """After the last step: the run's figures to the trackers that take them (W&B)."""
        if self.figures is not None:
            self.trackers.log_figures(self.step, functools.partial(self.figures, self.run_dir))

    def close(self) -> None:
        """Stop the executor's workers (if any) and release the run directory (another process may then resume it)."""
        try:
            self.trackers.close()
            if self.executor is not None:
                self.executor.close()
                self.executor = None
        finally:
            self.dir.release()

    # ---- checkpoints -------------------------------------------------------------------------
    def _saved_adapters(self) -> list[str]:
        """Adapters a checkpoint holds: every trained one, and the agent's whenever it is an adapter."""
        names = {ADAPTERS[r] for r in self.learners} | {ADAPTERS[AGENT]}
        return sorted(names - {ADAPTERS[AGENT]} if self.full else names)

    def save(self) -> Path | None:
        """A checkpoint of this step (rank 0 only under data parallelism: the ranks hold equal weights;
        every rank when the agent is sharded, each writing its own shards)."""
        if not self.lead and not self.sharded:
            return None
        population = self.population.state() if self.population is not None else {"pool": None, "member_rewards": {}}
        # A resume starts from the oldest batch not yet trained: batches in flight are played again, never twice trained.
        cursor, engine_state = self.cursor, self.engine.state_dict()
        if self._in_flight:
            cursor, engine_state = self._in_flight[0][0], {**engine_state, "groups": self._in_flight[0][1]}
        return self.dir.save_checkpoint(
            self.step,
            self.cfg.keep_last,
            Path(self.best[1]).name if self.best else None,
            chat=self.chat,
            adapters=self._saved_adapters(),
            optimizers={role: learner.optimizer for role, learner in self.learners.items() if not (self.sharded and role == AGENT)},
            state={
                "cursor": cursor,
                "best": self.best,
                "config": self.cfg.model_dump(mode="json"),
                "in_flight": len(self._in_flight),
                **population,
            },
            engine_state=engine_state,
            weights={ADAPTERS[AGENT]: self.agent_chat} if self.full and not self.sharded else None,
            sharded={ADAPTERS[AGENT]: (self.agent_chat.model, self.learners[AGENT].optimizer)} if self.sharded else None,
        )

    def restore(self, log: Callable[[str], None] = print) -> Trainer:
        """Continue from the newest whole checkpoint: weights, optimizers, RNG, cursor, counters.

        A damaged checkpoint (a file missing or changed against its manifest) is set aside with a warning
        and the next older one is used; a whole one that does not fit the run's models (its config was
        edited) is an error, and nothing is set aside. Then everything written after the restored step goes: metric
        lines (a torn last line too), rollout batches and pool snapshots, so each step, episode id and
        pool member appears once when the steps are played again. (A pool member evicted by a later
        snapshot cannot come back: keep ``pool.max_size`` above the snapshots between checkpoints.)
        """
        run = self.dir
        if self.sharded:
            # Loading shards is a collective: the lead picks the newest whole checkpoint (setting damaged ones
            # aside by their manifests) and every rank loads that one together.
            newest = run.load_newest_checkpoint(lambda path: None, log) if self.lead else None
            self._load_checkpoint(Path(data_parallel.broadcast(str(newest))))
        elif not self.lead:
            data_parallel.barrier()  # the lead sets damaged checkpoints aside and trims the run first
            run.load_newest_checkpoint(self._load_checkpoint, log)
            return self
        if not self.lead:
            data_parallel.barrier()  # while the lead trims the run
            return self
        try:
            if not self.sharded:
                run.load_newest_checkpoint(self._load_checkpoint, log)
            run.trim_metrics(self.step, log)
            run.trim_rollouts(self.step, log)
            if self._lost_in_flight:
                log(
                    f"resuming at step {self.step}: {self._lost_in_flight} batch(es) the generator had played ahead were never "
                    "trained and are played again (an async resume is not number-for-number)"
                )
            self.recorder = RolloutRecorder(run.rollouts)
            if self.population is not None:
                self.population.rewind(self.step, log)
        finally:
            data_parallel.barrier()
        return self

    def _load_checkpoint(self, path: Path) -> None:
        state, optimizers, rng = checkpoint.load_state(path)
        for name in self._saved_adapters():
            self.chat.load_adapter_weights(name, run_layout.saved_adapter(path, name))
        if self.sharded:
            checkpoint.load_sharded(path, {ADAPTERS[AGENT]: (self.agent_chat.model, self.learners[AGENT].optimizer)})
        elif self.full:
            self.agent_chat.load_weights(run_layout.weights_path(path, ADAPTERS[AGENT]))
        for role, learner in self.learners.items():
            if not (self.sharded and role == AGENT):
                learner.optimizer.load_state_dict(optimizers[role])
            for group in learner.optimizer.param_groups:  # the config's (a resume may change them: config_edits.py)
                group["lr"], group["weight_decay"] = learner.config.lr, learner.config.weight_decay
        checkpoint.restore_rng(rng)
        self.engine.load_state_dict(rng["engine"])
        self.step, self.cursor, self.best = state["step"], state["cursor"], state["best"]
        self._lost_in_flight = state.get("in_flight", 0)  # async: batches played but not trained when it was saved
        self._unsynced = self._run_adapters()
        if self.population is not None:
            self.population.load_state(state)
