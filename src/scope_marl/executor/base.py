"""The executor interface: where a step's rollouts (and an evaluation's jobs) are played.

The trainer, ``scope rollout`` and evaluation see only this interface; :func:`scope_marl.executor.open_executor`
picks the implementation once, from the config:

- ``local``: the engine in this process (:class:`LocalExecutor`);
- a ``sampler`` server: the engine in this process, its seats on the server, which receives the
  learner's adapters through disk (:class:`~scope_marl.executor.sampler.SamplerExecutor`);
- data-parallel ranks (torchrun): each rank plays its block of the groups and every rank gets every
  episode (:class:`~scope_marl.executor.ranks.RankExecutor`);
- ``ray``: workers that are Ray actors, each with its own engine; adapters go as tensors through the
  object store (:class:`~scope_marl.executor.ray_workers.RayExecutor`).

Every implementation plays a group under the number the local engine would give it, so all of them
sample the same episodes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from scope_marl.core.types import Episode
from scope_marl.envs.base import Task
from scope_marl.rollout.engine import RolloutEngine

EngineFactory = Callable[[], RolloutEngine]
T = TypeVar("T")


class Executor(Protocol):
    parallelism: int  # how many plays run at once (an evaluation cuts its jobs for them)

    def push(self, source, names: Sequence[str], version: int, simulator_id: str | None = None) -> None:
        """Make the players use adapters ``names`` as they now are on the learner's model ``source``
        (tagged ``version``; ``simulator_id``: a pool member now plays in the simulator's adapter)."""

    def play(self, tasks: Sequence[Task], first_group: int = 0) -> list[Episode]:
        """One group per task, numbered from ``first_group``; episodes in task order."""

    def map(self, jobs: Sequence[Callable[[], T]]) -> list[T]:
        """Run zero-argument jobs where the players are; results in job order."""

    def portable(self, agent):
        """What a job carries to play ``agent`` (an evaluation's ``AgentUnderTest``) where the jobs run."""

    def describe(self) -> str:
        """Where the plays run, for log lines."""

    def close(self) -> None: ...


class LocalExecutor:
    """The engine in this process: adapters are already the learner's own (they share its model)."""

    parallelism = 1

    def __init__(self, engine: RolloutEngine | None = None):
        self.engine = engine  # None: an executor for jobs only (scope eval)

    @property
    def generated_tokens(self) -> int:
        return self.engine.stats.generated_tokens if self.engine is not None else 0

    def push(self, source, names: Sequence[str], version: int, simulator_id: str | None = None) -> None:
        pass  # the engine plays on the learner's model itself

    def play(self, tasks: Sequence[Task], first_group: int = 0) -> list[Episode]:
        return self.engine.run(tasks, first_group=first_group)

    def map(self, jobs: Sequence[Callable[[], T]]) -> list[T]:
        return [job() for job in jobs]

    def portable(self, agent):
        return agent  # jobs run here: the live agent itself

    def describe(self) -> str:
        return "this process"

    def close(self) -> None:
        pass


@dataclass(frozen=True, eq=False)  # (no field-wise equality: its tensors do not compare to a bool)
class Replayed:
    """A population-pool member that plays one batch in the simulator's adapter (asynchronous population
    co-training): the batch is submitted with it, and the learner starts from it when it trains on the
    batch. The weights are read when it is drawn: the pool may evict (delete) the member before the batch plays."""

    adapter: str  # the adapter it plays in (the live simulator's)
    member_id: str
    simulator_id: str  # what its episodes name as their simulator
    path: Path  # its saved folder (peft layout), while the pool keeps it
    tensors: dict[str, Any]  # its weights as a peft state dict

    @classmethod
    def read(cls, adapter: str, member_id: str, simulator_id: str, path: str | Path) -> Replayed:
        from safetensors.torch import load_file

        return cls(adapter, member_id, simulator_id, Path(path), load_file(str(Path(path) / "adapter_model.safetensors")))


def play_replayed(engine, replayed: Replayed | None) -> None:
    """Before a batch: the member it was submitted with goes into the simulator's adapter of ``engine``'s models."""
    if replayed is not None:
        load_adapter_tensors(engine, {replayed.adapter: replayed.tensors})
        engine.simulator.simulator_id = replayed.simulator_id


def load_adapter_tensors(engine, adapters: dict[str, dict[str, Any]]) -> None:
    """Copy adapter tensors (name -> peft state dict) into every engine model that holds that adapter."""
    models = {id(engine.agent.model): engine.agent.model}
    seat = engine.simulator.direct_seat()
    if seat is not None:
        models[id(seat.model)] = seat.model
    for name, tensors in adapters.items():
        holders = [m for m in models.values() if name in getattr(m, "adapters", [])]
        if not holders:
            raise ValueError(f"no model of this worker holds adapter {name!r}; the worker's factory must add it")
        for model in holders:
            model.set_adapter_tensors(name, tensors)


def split_blocks(n: int, parts: int) -> list[tuple[int, int]]:
    """``n`` groups cut into ``parts`` contiguous blocks whose sizes differ by at most one."""
    base, extra = divmod(n, parts)
    out, start = [], 0
    for p in range(parts):
        stop = start + base + (1 if p < extra else 0)
        out.append((start, stop))
        start = stop
    return out
