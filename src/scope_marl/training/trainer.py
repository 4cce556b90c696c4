"""The training loop: rollout -> per-role learner updates -> pool / evaluation / checkpoint, step by step.

One base model holds every policy as a LoRA adapter: ``agent`` always, ``simulator`` in
co-training. The frozen KL reference is the base with adapters disabled. With ``finetune: full``
the agent is a separate full copy of the model instead, and the untouched base is its reference.
Each step reads the next ``tasks_per_step`` training tasks from a cursor (a seeded shuffle per pass
over the split), plays ``group_size`` rollouts per task, and updates each role in
``trainable_roles`` on its own streams and reward. Evaluation plays a panel of held-out simulators
on a fixed, seeded subset of the test split (``eval.split``) with its own engines, so it never
moves the training cursor or the training engine's counters.
Population co-training snapshots the simulator adapter into a :class:`SimulatorPool` every N steps
and loads a drawn member into the simulator adapter before each rollout.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path

import torch

from scope_marl.backends import load_backend
from scope_marl.backends.hf import HFChatModel
from scope_marl.config import TrainConfig, dump_config, load_config
from scope_marl.envs import AGENT, USER
from scope_marl.evaluation.evaluate import AgentUnderTest, compact, evaluate_panel
from scope_marl.evaluation.panel import Panel, load_panel
from scope_marl.rollout import RolloutEngine, RolloutRecorder, summarize
from scope_marl.rollout.factory import ModelPool, build_env, build_simulator
from scope_marl.seat import Seat
from scope_marl.training import checkpoint
from scope_marl.training.learner import Learner, LearnerConfig
from scope_marl.training.tensorboard import TensorBoardWriter

ADAPTERS = {AGENT: "agent", USER: "simulator"}


class Trainer:
    def __init__(self, cfg: TrainConfig, run_dir: str | Path):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        if cfg.deterministic:
            torch.use_deterministic_algorithms(True)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)

        models = ModelPool()
        self.chat = models.get(cfg.model)
        if not isinstance(self.chat, HFChatModel):
            raise ValueError(f"training needs a local transformers model (embedded or hf:PATH), got {cfg.model!r}")
        # LoRA: the agent is an adapter on the shared base. Full fine-tuning: the agent is its own
        # copy of the weights, and the shared base (which frozen simulators also play on) is its KL reference.
        self.full = cfg.finetune == "full"
        self.agent_chat = load_backend(cfg.model) if self.full else self.chat
        self.agent_adapter = None if self.full else ADAPTERS[AGENT]
        if self.full:
            self.chat.model.requires_grad_(False)
        self._add_adapters()
        self.env = build_env(cfg.env)
        self.simulator = build_simulator(cfg.simulator, models)
        agent = Seat(model=self.agent_chat, sampling=cfg.agent_sampling, adapter=self.agent_adapter, trainable=AGENT in cfg.trainable_roles)
        self.engine = RolloutEngine(self.env, agent, self.simulator, cfg.rollout)
        self.learners = {}
        for role in cfg.trainable_roles:
            fields = cfg.learner if role == AGENT or cfg.simulator_learner is None else cfg.simulator_learner
            temperature = cfg.agent_sampling.temperature if role == AGENT else cfg.simulator.sampling.temperature
            if role == AGENT and self.full:
                self.learners[role] = Learner(self.agent_chat, role, None, temperature, LearnerConfig(**fields), reference=self.chat)
            else:
                self.learners[role] = Learner(self.chat, role, ADAPTERS[role], temperature, LearnerConfig(**fields))
        self.models = models
        if cfg.eval.every:
            self.eval_panel()  # a bad eval.panel fails now, not after the first N training steps
        self.recorder = RolloutRecorder(self.run_dir / "rollouts")
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.tensorboard = TensorBoardWriter(self.run_dir / "tensorboard") if cfg.tensorboard else None
        self.pool = None
        self.step = 0
        self.cursor = 0
        self.best: tuple[float, str] | None = None
        # The agent's recent mean rewards against each pool member, for prioritized selection.
        self.member_rewards: dict[str, list[float]] = {}
        self.member: str | None = None

    def _add_adapters(self) -> None:
        from peft import LoraConfig

        lora = self.cfg.lora
        roles = ([] if self.full else [AGENT]) + ([USER] if self.cfg.simulator.mode == "trainable" else [])
        for role in roles:
            if ADAPTERS[role] not in self.chat.adapters:
                config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.target_modules))
                self.chat.add_adapter(ADAPTERS[role], config)

    # ---- data --------------------------------------------------------------------------------
    def next_tasks(self):
        """The next ``tasks_per_step`` training tasks: a seeded shuffle of the split per pass."""
        tasks = self.env.tasks("train")
        out = []
        for _ in range(self.cfg.tasks_per_step):
            epoch, index = divmod(self.cursor, len(tasks))
            order = list(range(len(tasks)))
            random.Random(self.cfg.seed * 1_000_003 + epoch).shuffle(order)
            out.append(tasks[order[index]])
            self.cursor += 1
        return out

    # ---- one step ----------------------------------------------------------------------------
    def train_step(self) -> dict:
        started = time.perf_counter()
        if self.cfg.pool is not None:
            self._ensure_pool()
            self._load_pool_member()
        episodes = self.engine.run(self.next_tasks())
        rollout_s = time.perf_counter() - started
        self.recorder.write_batch(episodes)
        self.step += 1
        summary = summarize(episodes, rollout_s, 0)
        record: dict = {"step": self.step, "rollout_s": rollout_s, "episodes": len(episodes), "status": summary["status"],
                        "generated_tokens": sum(s.num_sampled_tokens for e in episodes for s in e.streams.values())}
        for role, stats in summary["rewards"].items():
            record[f"reward_{role}"] = {"mean": stats["mean"], "std": stats["std"]}
        if self.member is not None and "reward_agent" in record:
            recent = self.member_rewards.setdefault(self.member, [])
            recent.append(record["reward_agent"]["mean"])
            del recent[:-8]  # a short window: the agent keeps changing
            record["pool_member"] = self.member
        update_started = time.perf_counter()
        for role, learner in self.learners.items():
            record[f"train_{role}"] = learner.step(episodes)
        record["update_s"] = time.perf_counter() - update_started
        if self.cfg.pool is not None and self.step % self.cfg.pool.every == 0:
            self._snapshot_simulator()
        if self.cfg.eval.every and self.step % self.cfg.eval.every == 0:
            results = self.evaluate()
            write_json_atomic(self.run_dir / "evals" / f"step-{self.step:06d}.json", results)
            record["eval"] = compact(results)
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.tensorboard is not None:
            self.tensorboard.write(record)
        held_out = record.get("eval", {}).get("reward_agent")
        if held_out is not None and (self.best is None or held_out > self.best[0]):
            # The best held-out agent so far gets a checkpoint of its own, kept beside the last N.
            # Stored as the folder name, so a moved run or a resume from another directory still finds it.
            self.best = (held_out, checkpoint.checkpoint_dir(self.run_dir, self.step).name)
            self.save()
        elif self.step % self.cfg.checkpoint_every == 0 or self.step == self.cfg.steps:
            self.save()
        return record

    def run(self, progress: bool = True) -> list[dict]:
        from tqdm.auto import tqdm

        records = []
        with tqdm(total=self.cfg.steps, initial=self.step, desc="train", unit="step", disable=not progress) as bar:
            while self.step < self.cfg.steps:
                record = self.train_step()
                records.append(record)
                bar.update(1)
                bar.set_postfix(reward=f"{record.get('reward_agent', {}).get('mean', float('nan')):.3f}")
        return records

    def eval_panel(self) -> Panel:
        """The panel periodic evaluation plays: ``eval.panel`` (or the single ``eval.simulator``), on
        this run's environment, agent sampling and seed, ``eval.tasks`` tasks of ``eval.split`` per
        simulator and ``eval.group_size`` samples each. Panel entries that are the training simulator
        (same id, or same settings) are marked as training, so the held-out aggregate leaves them out."""
        from pydantic import ValidationError

        from scope_marl.config import ConfigError, explain

        e = self.cfg.eval
        fields = {"env": self.cfg.env, "split": e.split, "tasks_per_simulator": e.tasks, "samples_per_task": e.group_size,
                  "seed": self.cfg.seed, "agent_sampling": self.cfg.agent_sampling, "max_concurrent": self.cfg.rollout.max_concurrent}
        fields = {k: v.model_dump(mode="json") if hasattr(v, "model_dump") else v for k, v in fields.items()}
        if e.panel is not None:
            data = {**load_panel(e.panel).model_dump(mode="json"), **fields}
        else:
            data = {"name": "heldout", "simulators": [{"id": getattr(e.simulator, "id", None) or "heldout",
                                                        "simulator": e.simulator.model_dump(mode="json")}], **fields}
        try:  # validated again on this run's env: a panel entry's env overrides must fit it
            panel = Panel.model_validate(data)
        except ValidationError as err:
            raise ConfigError(f"eval.panel {e.panel!r} does not fit this run's env ({self.cfg.env.name}):\n" + explain(err, Panel)) from None
        return panel.with_training(training_ids(panel, self.cfg.simulator))

    def evaluate(self, panel: Panel | None = None, log=lambda _: None) -> dict:
        """The agent against a panel of held-out simulators on a fixed, seeded subset of ``eval.split``.

        Builds its own engines: the training cursor and the training engine's counters never move.
        """
        agent = AgentUnderTest(self.agent_chat, self.agent_adapter, f"step {self.step}", self.models, self.step)
        return evaluate_panel(panel or self.eval_panel(), agent, log=log)

    # ---- population --------------------------------------------------------------------------
    def _ensure_pool(self) -> None:
        from scope_marl.simulators.pool import SimulatorPool

        if self.pool is not None:
            return
        root = self.run_dir / "pool"
        if (root / "manifest.json").exists():
            self.pool = SimulatorPool.load(root)
            return
        p = self.cfg.pool
        self.pool = SimulatorPool(root, max_size=p.max_size, selection=p.selection, seed=self.cfg.seed)
        self._snapshot_simulator(base=True)

    def _snapshot_simulator(self, base: bool = False) -> None:
        staging = self.run_dir / "pool-staging"
        shutil.rmtree(staging, ignore_errors=True)
        self.chat.model.save_pretrained(staging, selected_adapters=[ADAPTERS[USER]])
        self.pool.add(checkpoint.adapter_path(staging, ADAPTERS[USER]), step=self.step, base=base)
        shutil.rmtree(staging, ignore_errors=True)

    def _load_pool_member(self) -> None:
        """Load a drawn member's weights into the live simulator adapter before the rollout."""
        scores = {m: sum(r) / len(r) for m, r in self.member_rewards.items() if r}
        member = self.pool.select(rng=random.Random(self.cfg.seed * 1_000_003 + self.step), scores=scores)
        self.member = member.member_id
        self._load_adapter(ADAPTERS[USER], Path(member.path))
        self.chat.prefix_cache.clear()
        self.engine.simulator.simulator_id = f"trainable:{member.member_id}"

    def _load_adapter(self, name: str, folder: Path) -> None:
        """Overwrite adapter ``name``'s weights with those saved in ``folder`` (peft layout)."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(self.chat.model, load_file(str(folder / "adapter_model.safetensors")), adapter_name=name)

    # ---- checkpoints -------------------------------------------------------------------------
    def _saved_adapters(self) -> list[str]:
        """Adapters a checkpoint holds: every trained one, and the agent's whenever it is an adapter."""
        names = {ADAPTERS[r] for r in self.learners} | {ADAPTERS[AGENT]}
        return sorted(names - {ADAPTERS[AGENT]} if self.full else names)

    def save(self) -> Path:
        adapters = self._saved_adapters()
        state = {"cursor": self.cursor, "best": self.best, "pool": str(self.run_dir / "pool") if self.pool else None,
                 "member_rewards": self.member_rewards}
        engine_state = {"groups": self.engine._groups_started, "calls": self.engine._calls}
        path = checkpoint.save(self.run_dir, self.step, self.chat, adapters,
                               {role: l.optimizer for role, l in self.learners.items()}, state, engine_state,
                               weights={ADAPTERS[AGENT]: self.agent_chat} if self.full else None)
        checkpoint.prune(self.run_dir, self.cfg.keep_last, Path(self.best[1]).name if self.best else None)
        return path

    @classmethod
    def resume(cls, run_dir: str | Path) -> Trainer:
        """Continue a run from its own saved config and latest checkpoint."""
        run_dir = Path(run_dir)
        config_path = run_dir / "config.yaml"
        if not config_path.exists():
            raise FileNotFoundError(f"{run_dir} has no config.yaml: is it a run directory written by scope train?")
        trainer = cls(load_config(config_path, TrainConfig), run_dir)
        checkpoints = checkpoint.list_checkpoints(run_dir)
        if not checkpoints:
            raise FileNotFoundError(f"{run_dir} has no checkpoint yet; start it again with scope train CONFIG --out {run_dir}")
        latest = checkpoints[-1]
        state, optimizers, rng = checkpoint.load_state(latest)
        for name in trainer._saved_adapters():
            trainer._load_adapter(name, checkpoint.adapter_path(latest / "adapters", name))
        if trainer.full:
            checkpoint.load_weights(trainer.agent_chat, latest, ADAPTERS[AGENT])
        for role, learner in trainer.learners.items():
            learner.optimizer.load_state_dict(optimizers[role])
        checkpoint.restore_rng(rng)
        trainer.engine._groups_started = rng["engine"]["groups"]
        trainer.engine._calls = rng["engine"]["calls"]
        trainer.step, trainer.cursor, trainer.best = state["step"], state["cursor"], state["best"]
        trainer.member_rewards = state.get("member_rewards", {})
        trainer._truncate_metrics()
        return trainer

    def _truncate_metrics(self) -> None:
        """Drop metric lines of steps after the checkpoint (they will be played again)."""
        if not self.metrics_path.exists():
            return
        lines = [l for l in self.metrics_path.read_text().splitlines() if l.strip() and json.loads(l)["step"] <= self.step]
        self.metrics_path.write_text("".join(l + "\n" for l in lines))


def training_ids(panel: Panel, simulator) -> set[str]:
    """Panel entries that are the training simulator (or one of its rotation members): the same id,
    or the same settings under another id."""
    members = list(getattr(simulator, "members", [])) + [simulator]
    ids = {m.id for m in members if getattr(m, "id", None)}
    settings = [m.model_dump(exclude={"id"}) for m in members]
    return {s.id for s in panel.simulators if s.id in ids or s.simulator.model_dump(exclude={"id"}) in settings}


def write_json_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def start(cfg: TrainConfig, run_dir: str | Path) -> Trainer:
    run_dir = Path(run_dir)
    if (run_dir / "metrics.jsonl").exists():
        raise FileExistsError(f"{run_dir} already holds a run; continue it with: scope train --resume {run_dir}")
    trainer = Trainer(cfg, run_dir)
    dump_config(cfg, run_dir / "config.yaml")
    return trainer
