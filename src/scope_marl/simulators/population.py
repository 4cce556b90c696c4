"""Population co-training's user side: each rollout group draws one pool member to play the user.

Pool members are LoRA snapshots of the trainable simulator on disk (:class:`SimulatorPool`). A drawn
member is loaded once as its own adapter on the shared model (named after its member id, so two
members never share weights) and plays that group as a frozen simulator. The episode records the
member id and its content hash. For ``prioritized`` selection the agent's results against each
member are fed back with :meth:`record`.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence

from scope_marl.backends.base import SamplingParams
from scope_marl.core.seeds import derive_seed
from scope_marl.simulators.base import Simulator, SimulatorTurn
from scope_marl.simulators.frozen import FrozenSimulator
from scope_marl.simulators.pool import SimulatorPool


class PopulationSimulator(Simulator[str]):
    def __init__(
        self, pool: SimulatorPool, model, sampling: SamplingParams | None = None, prompt_prefix: str = "", seed: int = 0, window: int = 64
    ):
        self.pool = pool
        self.model = model
        self.sampling = sampling or SamplingParams()
        self.prompt_prefix = prompt_prefix
        self.seed = seed
        self.window = window  # recent agent rewards kept per member for prioritized selection
        self.simulator_id = f"pool:{pool.root}"
        self._rewards: dict[str, list[float]] = defaultdict(list)

    def scores(self) -> dict[str, float]:
        """The agent's mean recent reward against each member (higher: the agent does better)."""
        return {m: sum(r) / len(r) for m, r in self._rewards.items() if r}

    def record(self, member_id: str, agent_reward: float) -> None:
        rewards = self._rewards[member_id]
        rewards.append(agent_reward)
        del rewards[: -self.window]

    def for_group(self, group_index: int) -> Simulator[str]:
        # Seeded by (seed, group): a resumed run draws the same members for the same groups.
        member = self.pool.select(rng=random.Random(derive_seed(self.seed, group_index)), scores=self.scores())
        adapter = f"pool-{member.member_id}"
        self._sync_adapters(adapter, member.path)
        return FrozenSimulator(
            self.model,
            self.sampling,
            self.prompt_prefix,
            adapter=adapter,
            simulator_id=f"pool:{member.member_id}@{member.content_hash[:12]}",
        )

    def _sync_adapters(self, adapter: str, path: str) -> None:
        """Load the drawn member's adapter; drop adapters of members the pool has evicted."""
        live = {f"pool-{m.member_id}" for m in self.pool.members}
        for name in [a for a in self.model.adapters if a.startswith("pool-") and a not in live]:
            self.model.remove_adapter(name)
        if adapter not in self.model.adapters:
            self.model.add_adapter(adapter, path)

    def identity(self) -> dict:
        return {
            "id": self.simulator_id,
            "mode": "pool",
            "members": [m.member_id for m in self.pool.members],
            "selection": self.pool.selection,
        }

    def respond(self, turns: Sequence[SimulatorTurn]) -> list[str]:
        raise TypeError("a PopulationSimulator answers through the member drawn for each group: call for_group(i) first")
