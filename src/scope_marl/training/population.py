"""Population co-training's side of a run: the pool of simulator snapshots and which member plays.

Every ``pool.every`` steps the simulator adapter is snapshotted into a
:class:`~scope_marl.simulators.pool.SimulatorPool` in the run directory (the untrained simulator is its
first, base member); before each rollout a member is drawn (seeded by the step, weighted by the agent's
recent rewards against each member when the pool's selection asks for it) and its weights are loaded
into the live simulator adapter. Under data parallelism the lead writes the pool and the other ranks
read what it wrote.

Asynchronous training (``trainer.mode: async``) draws the member when a batch is submitted
(:meth:`Population.choose`, from the pool as it is then), sends it with the batch, and loads it into
the live adapter only when the learners train on that batch (:meth:`Population.load`): the simulator
learner starts from the member that played, as a synchronous step does.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable
from pathlib import Path

from scope_marl.core import run_layout
from scope_marl.core.seeds import derive_seed
from scope_marl.executor.base import Replayed
from scope_marl.simulators.pool import SimulatorPool
from scope_marl.training import data_parallel

RECENT = 8  # rewards kept per member: a short window, as the agent keeps changing


class Population:
    """The pool a run trains against. ``chat`` holds the live simulator adapter ``adapter``; ``engine``
    is the rollout engine whose simulator plays it."""

    def __init__(self, settings, seed: int, run_dir: Path, chat, adapter: str, engine, lead: bool = True):
        self.settings, self.seed, self.lead = settings, seed, lead
        self.root = Path(run_dir) / run_layout.POOL
        self.staging = Path(run_dir) / "pool-staging"
        self.chat, self.adapter, self.engine = chat, adapter, engine
        self.pool: SimulatorPool | None = None
        self.member: str | None = None
        self.member_rewards: dict[str, list[float]] = {}  # the agent's recent mean rewards per member
        self.restored_with_pool = False  # the restored checkpoint was trained against a pool in root

    def draw(self, step: int) -> None:
        """Before the rollout of step ``step + 1``: the pool exists (its base member taken at the first
        step), and a drawn member's weights are in the simulator adapter."""
        self.load(self.choose(step))

    def choose(self, step: int) -> Replayed:
        """The member that plays the batch of step ``step + 1`` (the pool is made at the first draw), with its weights."""
        self._ensure(step)
        scores = {m: sum(r) / len(r) for m, r in self.member_rewards.items() if r}
        member = self.pool.select(rng=random.Random(derive_seed(self.seed, step)), scores=scores)
        return Replayed.read(self.adapter, member.member_id, f"trainable:{member.member_id}", member.path)

    def load(self, replayed: Replayed) -> None:
        """Put a drawn member's weights into the live simulator adapter; its episodes are credited to it."""
        self.member = replayed.member_id
        self.chat.set_adapter_tensors(self.adapter, replayed.tensors)
        self.engine.simulator.simulator_id = replayed.simulator_id

    def record(self, record: dict) -> None:
        """Credit the step's mean agent reward to the member that played, and name it in the record."""
        if self.member is None or "reward_agent" not in record:
            return
        recent = self.member_rewards.setdefault(self.member, [])
        recent.append(record["reward_agent"]["mean"])
        del recent[:-RECENT]
        record["pool_member"] = self.member

    def after_update(self, step: int) -> None:
        if step % self.settings.every == 0:
            self.snapshot(step)

    def snapshot(self, step: int, base: bool = False) -> None:
        """The lead writes the simulator adapter into the pool; the other ranks read the pool it wrote."""
        if self.lead:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.chat.model.save_pretrained(self.staging, selected_adapters=[self.adapter])
            self.pool.add(run_layout.adapter_path(self.staging, self.adapter), step=step, base=base)
            shutil.rmtree(self.staging, ignore_errors=True)
        data_parallel.barrier()
        if not self.lead:
            self.pool = SimulatorPool.load(self.root)

    def _ensure(self, step: int) -> None:
        if self.pool is not None:
            return
        exists = SimulatorPool.exists(self.root)
        data_parallel.barrier()  # every rank has looked before the lead creates it
        if exists:
            self.pool = SimulatorPool.load(self.root)
            return
        if self.lead:
            s = self.settings
            self.pool = SimulatorPool(self.root, max_size=s.max_size, selection=s.selection, seed=self.seed)
        self.snapshot(step, base=True)

    # ---- checkpoints -------------------------------------------------------------------------
    def state(self) -> dict:
        return {"pool": str(self.root) if self.pool else None, "member_rewards": self.member_rewards}

    def load_state(self, state: dict) -> None:
        self.member_rewards = state.get("member_rewards", {})
        self.restored_with_pool = bool(state.get("pool"))

    def rewind(self, step: int, log: Callable[[str], None]) -> None:
        """Drop snapshots taken after the restored step (they are taken again as the steps replay). A run
        whose checkpoint trained against a pool that is gone stops: a new pool would silently replace
        every earlier member with today's simulator."""
        if not SimulatorPool.exists(self.root):
            if self.restored_with_pool:
                raise FileNotFoundError(
                    f"{self.root} has no pool manifest, but the checkpoint of step {step} was trained against that pool; "
                    f"put the pool back (e.g. from a backup of {self.root}) and resume, or start a new run"
                )
            return
        dropped = SimulatorPool.load(self.root).rewind(step)
        if dropped:
            log(f"removed pool member(s) {', '.join(dropped)} snapshotted after step {step}; they are taken again")
