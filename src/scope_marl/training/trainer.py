"""The training loop: rollout -> per-role learner updates -> pool / evaluation / checkpoint, step by step.

One base model holds every policy as a LoRA adapter: ``agent`` always, ``simulator`` in
co-training. The frozen KL reference is the base with adapters disabled. With ``finetune: full``
the agent is a separate full copy of the model instead, and the untouched base is its reference.
Each step reads the next ``tasks_per_step`` training tasks from a cursor (a seeded shuffle per pass
over the split), plays ``group_size`` rollouts per task, and updates each role in
``trainable_roles`` on its own streams and reward. Every ``eval.every`` steps an
:class:`Evaluator` (supplied by the caller: :mod:`scope_marl.experiment` wires in
:mod:`scope_marl.evaluation`, which training never imports) plays the agent against held-out
simulators with its own engines, so it never moves the training cursor or the engine's counters.
Population co-training snapshots the simulator adapter into a :class:`SimulatorPool` every N steps
and loads a drawn member into the simulator adapter before each rollout.
"""

from __future__ import annotations

import functools
import json
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch

from scope_marl.assembly import ModelCache, build_env, build_simulator
from scope_marl.backends import load_backend
from scope_marl.backends.hf import HFChatModel
from scope_marl.backends.placement import CPU, Placement, resolve_placement
from scope_marl.backends.seat import Seat
from scope_marl.config import TrainConfig, load_config
from scope_marl.core import files, run_layout
from scope_marl.core.run_lock import RunLock
from scope_marl.core.seeds import derive_seed, shuffled_position
from scope_marl.envs import AGENT, USER
from scope_marl.rollout import RolloutEngine, RolloutRecorder, summarize
from scope_marl.training import checkpoint, data_parallel, sharding
from scope_marl.training.learner import Learner
from scope_marl.training.tensorboard import TensorBoardWriter

ADAPTERS = {AGENT: "agent", USER: "simulator"}
SAMPLER_ADAPTERS = "sampler-adapters"  # in the run directory: the adapter versions a sampler server reads


def add_run_adapters(chat: HFChatModel, cfg: TrainConfig) -> None:
    """The run's LoRA adapters on the base: the agent's (unless it is fully fine-tuned) and, in
    co-training, the simulator's."""
    from peft import LoraConfig

    lora = cfg.lora
    roles = ([] if cfg.finetune == "full" else [AGENT]) + ([USER] if cfg.simulator.mode == "trainable" else [])
    for role in roles:
        if ADAPTERS[role] in chat.adapters:
            continue
        init = getattr(cfg.simulator, "init", None) if role == USER else None
        if init is not None:  # co-training that starts from a saved simulator (e.g. scope sft's adapter)
            if not (Path(init) / "adapter_config.json").is_file():
                raise ValueError(f"simulator.init {init!r} is not a saved adapter directory (no adapter_config.json there)")
            chat.add_adapter(ADAPTERS[role], init)
            continue
        config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.target_modules))
        chat.add_adapter(ADAPTERS[role], config)


def build_policies(cfg: TrainConfig, models: ModelCache) -> tuple[HFChatModel, HFChatModel, RolloutEngine]:
    """The base model with the run's adapters, the model the agent plays on (the base, or its own full
    copy) and the rollout engine: what the trainer plays with, and what each Ray rollout worker builds.

    With ``cfg.sampler`` every seat on ``cfg.model`` plays on that server instead (the same weights,
    with the run's adapters pushed to it by the trainer), while the learners train the local copy."""
    chat = models.get(cfg.model)
    if not isinstance(chat, HFChatModel):
        raise ValueError(f"training needs a local transformers model (embedded or hf:PATH), got {cfg.model!r}")
    # LoRA: the agent is an adapter on the shared base. Full fine-tuning: the agent is its own
    # copy of the weights, and the shared base (which frozen simulators also play on) is its KL reference.
    full = cfg.finetune == "full"
    placement = models.placement or CPU
    if shards_agent(cfg, placement):
        # Sharded (training.sharding): float32 master weights, gathered in the compute dtype for each forward.
        agent_chat = load_backend(cfg.model, Placement(placement.device, torch.float32))
        sharding.open_world_of_one(placement.device)  # a single process still needs a process group
        sharding.shard(agent_chat.model, placement.dtype)
        agent_chat.packed = None  # the gathered weights are new tensors each time: no packed copies of them
    elif full:
        agent_chat = load_backend(cfg.model, placement)
    else:
        agent_chat = chat
    if full:
        chat.model.requires_grad_(False)
    add_run_adapters(chat, cfg)
    env = build_env(cfg.env, models)
    seats, agent_model = models, agent_chat
    if cfg.sampler is not None:
        seats = ModelCache()
        seats.register(cfg.model, remote_sampler(cfg.sampler, chat))
        agent_model = seats.get(cfg.model)
    simulator = build_simulator(cfg.simulator, seats)
    agent = Seat(
        model=agent_model, sampling=cfg.agent_sampling, adapter=None if full else ADAPTERS[AGENT], trainable=AGENT in cfg.trainable_roles
    )
    return chat, agent_chat, RolloutEngine(env, agent, simulator, cfg.rollout)


def shards_agent(cfg: TrainConfig, placement: Placement) -> bool:
    """Whether the fully fine-tuned agent is sharded with FSDP2: asked for (``hardware.parallel: fsdp``),
    or needed for float32 master weights under a bfloat16 run (then on however many ranks there are, one included)."""
    if cfg.hardware.parallel == "fsdp" and cfg.finetune != "full":
        raise ValueError(
            "hardware.parallel: fsdp shards a fully fine-tuned agent (finetune: full); LoRA runs keep a whole base on every "
            "rank in this release: use parallel: replicate with finetune: lora"
        )
    return cfg.finetune == "full" and (cfg.hardware.parallel == "fsdp" or placement.dtype != torch.float32)


def remote_sampler(spec: str, chat: HFChatModel):
    """The sampler server as a backend, checked to tokenize exactly as the learner's local copy does."""
    sampler = load_backend(spec)
    if not hasattr(sampler, "load_adapter"):
        raise ValueError(f"sampler {spec!r} cannot receive adapters; use a vllm:MODEL@URL server")
    probe = "Hello <|im_end|> 1.50 dollars"
    if sampler.encode_text(probe) != chat.encode_text(probe) or sampler.stop_ids != chat.stop_ids:
        raise ValueError(f"sampler {spec!r} tokenizes differently from the model the learners train; serve the same model")
    return sampler


def worker_engine(cfg: TrainConfig) -> RolloutEngine:
    """A Ray rollout worker's engine: the run's models and adapters (their weights arrive by push)."""
    return build_policies(cfg, ModelCache(resolve_placement(cfg.hardware)))[2]


class Evaluator(Protocol):
    """Periodic evaluation during training, as the trainer sees it."""

    def evaluate(self, chat: HFChatModel, adapter: str | None, models: ModelCache, step: int, executor=None) -> dict:
        """Play the agent (``adapter`` on ``chat``; None: the model itself) and return the full results
        (written to ``evals/step-N.json``); with a Ray ``executor``, on its workers."""

    def metrics(self, results: dict) -> dict:
        """The part of ``results`` that goes into the step's metrics line. Its ``reward_agent`` (the
        held-out mean reward) picks the best checkpoint."""


class Trainer:
    """Holds its run directory's lock (``core.run_lock``) from construction until :meth:`run` ends or
    :meth:`close` is called, so no second process can train into the same directory meanwhile."""

    def __init__(self, cfg: TrainConfig, run_dir: str | Path, evaluator: Evaluator | None = None, lock: RunLock | None = None):
        if cfg.eval.every and evaluator is None:
            raise ValueError(
                "eval.every is set but no evaluator was given: start runs with scope_marl.experiment.start "
                "or .resume (they wire in the evaluation panel), or set eval.every: 0"
            )
        self.run_dir = Path(run_dir)
        # Data-parallel (torchrun): every rank trains, rank 0 ("the lead") alone writes the run directory.
        self.rank, self.world = data_parallel.rank(), data_parallel.world()
        self.lead = self.rank == 0
        if self.world > 1 and cfg.executor == "ray":
            raise ValueError(
                "data-parallel ranks (torchrun) each play their own groups: use executor: local with torchrun, or Ray without it"
            )
        if self.world > 1 and cfg.sampler is not None:
            # Every rank would save its adapters into the same run directory for the server to read.
            raise ValueError("a sampler server takes adapters from one process: train with a sampler without torchrun")
        self.lock = None if not self.lead else lock if lock is not None and lock.held else RunLock(self.run_dir).acquire()
        self.evaluator = evaluator
        self.cfg = cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
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
        self.models = models
        self.recorder = RolloutRecorder(self.run_dir / run_layout.ROLLOUTS)
        self.metrics_path = self.run_dir / run_layout.METRICS
        self.tensorboard = TensorBoardWriter(self.run_dir / run_layout.TENSORBOARD) if cfg.tensorboard and self.lead else None
        self.pool = None
        self.step = 0
        self.cursor = 0
        self.best: tuple[float, str] | None = None
        # The agent's recent mean rewards against each pool member, for prioritized selection.
        self.member_rewards: dict[str, list[float]] = {}
        self.member: str | None = None
        # Ray rollout workers (executor: ray) hold their own copies of the models; adapters changed
        # since the last push are sent before the next rollout, tagged with the step they are from.
        self.executor = None
        self._unsynced = self._run_adapters()
        if cfg.executor == "ray":
            from scope_marl.executor import RayExecutor

            r = cfg.ray
            factory = functools.partial(worker_engine, cfg)
            self.executor = RayExecutor(factory, workers=r.workers, address=r.address, threads=r.threads, num_cpus=r.num_cpus)

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
    def train_step(self) -> dict:
        started = time.perf_counter()
        if self.cfg.pool is not None:
            self._ensure_pool()
            self._load_pool_member()
        episodes = self._play(self.next_tasks())
        rollout_s = time.perf_counter() - started
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
        for role, stats in summary["rewards"].items():
            record[f"reward_{role}"] = {"mean": stats["mean"], "std": stats["std"]}
        reported = self.engine.simulator.batch_metrics(episodes)
        if reported:
            record["simulator"] = reported
        if self.member is not None and "reward_agent" in record:
            recent = self.member_rewards.setdefault(self.member, [])
            recent.append(record["reward_agent"]["mean"])
            del recent[:-8]  # a short window: the agent keeps changing
            record["pool_member"] = self.member
        update_started = time.perf_counter()
        for role, learner in self.learners.items():
            record[f"train_{role}"] = learner.step(episodes)  # under data parallelism each rank trains on its groups
            self._unsynced.add(ADAPTERS[role])
        record["update_s"] = time.perf_counter() - update_started
        if self.cfg.pool is not None and self.step % self.cfg.pool.every == 0:
            self._snapshot_simulator()
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
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.tensorboard is not None:
            self.tensorboard.write(record)
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

    def _push_to_sampler(self) -> None:
        """Adapters changed since the last rollout go to the sampler server: saved under the step they are
        from (the server reads them from disk) and loaded as NAME-vSTEP; the server then drops the old version."""
        sampler = self.engine.agent.model
        for name in sorted(self._unsynced):
            folder = self.run_dir / SAMPLER_ADAPTERS / f"{name}-v{self.step}"
            with files.atomic_directory(folder) as tmp:
                self.chat.model.save_pretrained(tmp, selected_adapters=[name])
            sampler.load_adapter(name, run_layout.adapter_path(folder, name), self.step)
            for old in (self.run_dir / SAMPLER_ADAPTERS).glob(f"{name}-v*"):
                if old != folder:
                    shutil.rmtree(old, ignore_errors=True)
        self._unsynced.clear()

    def _play(self, tasks) -> list:
        """One step's groups: on the local engine; or on the Ray workers, or one block per data-parallel
        rank, under the numbers the local engine would give them (so every path samples the same episodes)."""
        if self.cfg.sampler is not None and self._unsynced:
            self._push_to_sampler()
        with sharding.gathered(self.agent_chat.model):  # a sharded agent plays with its whole weights on every rank
            return self._play_gathered(tasks)

    def _play_gathered(self, tasks) -> list:
        if self.world == 1 and self.executor is None:
            return self.engine.run(tasks)
        first = self.engine.state_dict()["groups"]
        if self.world > 1:
            from scope_marl.executor import split_blocks

            start, stop = split_blocks(len(tasks), self.world)[self.rank]
            episodes = data_parallel.gather(self.engine.run(tasks[start:stop], first_group=first + start))
        else:
            if self._unsynced:
                adapters = {name: self.chat.adapter_tensors(name) for name in sorted(self._unsynced)}
                simulator_id = self.engine.simulator.simulator_id if self.pool is not None else None
                self.executor.push(adapters, version=self.step, simulator_id=simulator_id)
                self._unsynced.clear()
            episodes = self.executor.run(tasks, first_group=first)
        self.engine.load_state_dict({"groups": first + len(tasks)})  # the groups played elsewhere are counted here
        return episodes

    def run(self, progress: bool = True) -> list[dict]:
        from tqdm.auto import tqdm

        records = []
        try:
            with tqdm(total=self.cfg.steps, initial=self.step, desc="train", unit="step", disable=not (progress and self.lead)) as bar:
                while self.step < self.cfg.steps:
                    record = self.train_step()
                    records.append(record)
                    bar.update(1)
                    bar.set_postfix(reward=f"{record.get('reward_agent', {}).get('mean', float('nan')):.3f}")
        finally:
            self.close()
        return records

    def close(self) -> None:
        """Stop the Ray workers (if any) and release the run directory (another process may then resume it)."""
        try:
            if self.executor is not None:
                self.executor.close()
                self.executor = None
        finally:
            if self.lock is not None:
                self.lock.release()

    # ---- population --------------------------------------------------------------------------
    def _ensure_pool(self) -> None:
        from scope_marl.simulators.pool import SimulatorPool

        if self.pool is not None:
            return
        root = self.run_dir / run_layout.POOL
        exists = (root / "manifest.json").exists()
        data_parallel.barrier()  # every rank has looked before the lead creates it
        if exists:
            self.pool = SimulatorPool.load(root)
            return
        if self.lead:
            p = self.cfg.pool
            self.pool = SimulatorPool(root, max_size=p.max_size, selection=p.selection, seed=self.cfg.seed)
        self._snapshot_simulator(base=True)

    def _snapshot_simulator(self, base: bool = False) -> None:
        """The lead writes the simulator adapter into the pool; the other ranks read the pool it wrote."""
        from scope_marl.simulators.pool import SimulatorPool

        if self.lead:
            staging = self.run_dir / "pool-staging"
            shutil.rmtree(staging, ignore_errors=True)
            self.chat.model.save_pretrained(staging, selected_adapters=[ADAPTERS[USER]])
            self.pool.add(run_layout.adapter_path(staging, ADAPTERS[USER]), step=self.step, base=base)
            shutil.rmtree(staging, ignore_errors=True)
        data_parallel.barrier()
        if not self.lead:
            self.pool = SimulatorPool.load(self.run_dir / run_layout.POOL)

    def _load_pool_member(self) -> None:
        """Load a drawn member's weights into the live simulator adapter before the rollout."""
        scores = {m: sum(r) / len(r) for m, r in self.member_rewards.items() if r}
        member = self.pool.select(rng=random.Random(derive_seed(self.cfg.seed, self.step)), scores=scores)
        self.member = member.member_id
        self.chat.load_adapter_weights(ADAPTERS[USER], Path(member.path))
        self._unsynced.add(ADAPTERS[USER])
        self.engine.simulator.simulator_id = f"trainable:{member.member_id}"

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
        adapters = self._saved_adapters()
        state = {
            "cursor": self.cursor,
            "best": self.best,
            "pool": str(self.run_dir / run_layout.POOL) if self.pool else None,
            "member_rewards": self.member_rewards,
        }
        path = checkpoint.save(
            self.run_dir,
            self.step,
            self.chat,
            adapters,
            {role: learner.optimizer for role, learner in self.learners.items() if not (self.sharded and role == AGENT)},
            state,
            self.engine.state_dict(),
            weights={ADAPTERS[AGENT]: self.agent_chat} if self.full and not self.sharded else None,
            sharded={ADAPTERS[AGENT]: (self.agent_chat.model, self.learners[AGENT].optimizer)} if self.sharded else None,
        )
        if not self.lead:
            return path
        checkpoint.prune(self.run_dir, self.cfg.keep_last, Path(self.best[1]).name if self.best else None)
        return path

    def restore(self, log: Callable[[str], None] = print) -> Trainer:
        """Continue from the newest whole checkpoint: weights, optimizers, RNG, cursor, counters.

        A damaged checkpoint (a file missing, changed or unloadable) is set aside with a warning and
        the next older one is used. Then everything written after the restored step goes: metric
        lines (a torn last line too), rollout batches and pool snapshots, so each step, episode id and
        pool member appears once when the steps are played again. (A pool member evicted by a later
        snapshot cannot come back: keep ``pool.max_size`` above the snapshots between checkpoints.)
        """
        if self.sharded:
            # Loading shards is a collective: the lead picks the newest whole checkpoint (setting damaged ones
            # aside by their manifests) and every rank loads that one together.
            newest = checkpoint.load_newest(self.run_dir, lambda path: None, log) if self.lead else None
            self._load_checkpoint(Path(data_parallel.broadcast(str(newest))))
        elif not self.lead:
            data_parallel.barrier()  # the lead sets damaged checkpoints aside and trims the run first
            self._load_newest_checkpoint(log)
            return self
        if not self.lead:
            data_parallel.barrier()  # while the lead trims the run
            return self
        try:
            if not self.sharded:
                self._load_newest_checkpoint(log)
            self._truncate_metrics(log)
            self._trim_rollouts(log)
            self._rewind_pool(log)
        finally:
            data_parallel.barrier()
        return self

    def _load_newest_checkpoint(self, log: Callable[[str], None]) -> None:
        checkpoint.load_newest(self.run_dir, self._load_checkpoint, log, quarantine=self.lead, command="scope train CONFIG --out NEW_DIR")

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
        checkpoint.restore_rng(rng)
        self.engine.load_state_dict(rng["engine"])
        self.step, self.cursor, self.best = state["step"], state["cursor"], state["best"]
        self._unsynced = self._run_adapters()
        self.member_rewards = state.get("member_rewards", {})

    def _rewind_pool(self, log: Callable[[str], None]) -> None:
        """Drop pool snapshots taken after the checkpoint (they are taken again as the steps replay)."""
        from scope_marl.simulators.pool import SimulatorPool

        root = self.run_dir / run_layout.POOL
        if self.cfg.pool is None or not (root / "manifest.json").exists():
            return
        dropped = SimulatorPool.load(root).rewind(self.step)
        if dropped:
            log(f"removed pool member(s) {', '.join(dropped)} snapshotted after step {self.step}; they are taken again")

    def _truncate_metrics(self, log: Callable[[str], None]) -> None:
        truncate_metrics(self.metrics_path, self.step, log)

    def _trim_rollouts(self, log: Callable[[str], None]) -> None:
        """Remove rollout batches written after the checkpoint (batch k holds step k + 1's episodes)."""
        later = [p for p in self.recorder.out_dir.glob("episodes-*.jsonl") if int(p.stem.split("-")[1]) >= self.step]
        for path in later:
            path.unlink()
        if later:
            log(f"removed {len(later)} rollout batch(es) of steps after {self.step} from {self.recorder.out_dir}; they are played again")
        self.recorder = RolloutRecorder(self.recorder.out_dir)


def truncate_metrics(path: Path, step: int, log: Callable[[str], None]) -> None:
    """Drop metric lines of steps after ``step`` (the restored checkpoint's: they will be played
    again), and a torn last line (a crash mid-append)."""
    if not path.exists():
        return
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append((json.loads(line)["step"], line))
        except (ValueError, KeyError, TypeError):
            if number < len(lines):
                raise ValueError(f"{path} line {number} is not a metrics record; fix or remove that line, then resume") from None
            log(f"warning: dropped the torn last line of {path} (a crash mid-write)")
    files.write_text(path, "".join(line + "\n" for s, line in records if s <= step))


def read_run_config(run_dir: str | Path) -> TrainConfig:
    """The config a run directory was started with (what ``--resume`` continues)."""
    path = Path(run_dir) / run_layout.CONFIG
    if not path.exists():
        raise FileNotFoundError(f"{run_dir} has no {run_layout.CONFIG}: is it a run directory written by scope train?")
    return load_config(path, TrainConfig)


def check_new_run(run_dir: str | Path) -> None:
    if (Path(run_dir) / run_layout.METRICS).exists():
        raise FileExistsError(f"{run_dir} already holds a run; continue it with: scope train --resume {run_dir}")
