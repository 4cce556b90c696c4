"""Rotation over K simulators (the paper's "ensemble" baseline, K = 3).

Each GRPO group faces ONE member, chosen round-robin over groups or at random with a seed, so the
group baseline compares rollouts against the same user. (The reference release mixed simulators
inside a group, which turns simulator differences into advantage noise.)
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal

from scope_marl.core.seeds import derive_seed
from scope_marl.simulators.base import Reply, Simulator, SimulatorTurn


class Rotation(Simulator[Reply]):
    def __init__(self, members: Sequence[Simulator[Reply]], order: Literal["round_robin", "random"] = "round_robin", seed: int = 0):
        if not members:
            raise ValueError("Rotation needs at least one member simulator")
        ids = [m.simulator_id for m in members]
        if len(set(ids)) != len(ids):
            raise ValueError(f"rotation members need distinct simulator ids to be told apart in results, got {ids}")
        self.members = list(members)
        self.order = order
        self.seed = seed
        self.simulator_id = "rotation(" + ",".join(ids) + ")"

    def for_group(self, group_index: int) -> Simulator[Reply]:
        if self.order == "round_robin":
            member = self.members[group_index % len(self.members)]
        else:
            # Seeded by (seed, group) rather than a running RNG, so a resumed run picks the same members.
            member = random.Random(derive_seed(self.seed, group_index)).choice(self.members)
        return member.for_group(group_index)

    def batch_metrics(self, episodes) -> dict:
        out: dict = {}
        for member in self.members:
            out.update(member.batch_metrics(episodes))
        return out

    def identity(self) -> dict:
        return {"id": self.simulator_id, "mode": "rotation", "order": self.order, "members": [m.simulator_id for m in self.members]}

    def respond(self, turns: Sequence[SimulatorTurn]) -> list[Reply]:
        raise TypeError("a Rotation answers through the member chosen for each group: call for_group(i) first")
