"""Rollouts across data-parallel ranks (torchrun): each rank plays its own block of a step's groups
on its engine, under the numbers the local engine would give them, and every rank gets every episode."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from scope_marl.core.types import Episode
from scope_marl.envs.base import Task
from scope_marl.executor.base import LocalExecutor, split_blocks
from scope_marl.rollout.engine import RolloutEngine


class Ranks(Protocol):
    """The process group, as ``scope_marl.training.data_parallel`` provides it."""

    def rank(self) -> int: ...
    def world(self) -> int: ...
    def gather(self, episodes: list[Episode]) -> list[Episode]: ...


class RankExecutor(LocalExecutor):
    """Every rank holds the same weights (the learners all-reduce their gradients), so a push is a no-op;
    jobs (an evaluation, which the lead alone runs) run in this process."""

    def __init__(self, engine: RolloutEngine, ranks: Ranks):
        super().__init__(engine)
        self.ranks = ranks

    def play(self, tasks: Sequence[Task], first_group: int = 0) -> list[Episode]:
        start, stop = split_blocks(len(tasks), self.ranks.world())[self.ranks.rank()]
        return self.ranks.gather(self.engine.run(tasks[start:stop], first_group=first_group + start))

    def describe(self) -> str:
        return f"rank {self.ranks.rank()} of {self.ranks.world()}"
