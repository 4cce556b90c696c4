"""The lab's agent: a small categorical policy over persuasion strategies.

pi(strategy | turn, user's previous act) is one logit vector per dialogue state, all zeros at the
start (uniform: the untrained agent has no preference). A table rather than a network because the
state space is tiny and a table makes every learned preference readable; the learner treats it
like any policy (log-probs and entropies of sampled choices, the shared GRPO loss).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from scope_marl.lab.games import Game
from scope_marl.lab.simulators import draw, entropy_nats


class StrategyPolicy(nn.Module):
    def __init__(self, game: Game):
        super().__init__()
        self.logits = nn.Parameter(torch.zeros(game.turns, len(game.acts) + 1, len(game.strategies)))

    def forward(self, turn: int | Tensor, previous: Tensor) -> Tensor:
        """Log-probabilities over strategies [..., S] at turn(s) ``turn`` after previous act(s) ``previous``."""
        return self.logits[turn, previous].log_softmax(-1)

    def choose(self, turn: int, previous: Tensor, alive: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        """One strategy per dialogue drawn from the policy (one uniform per row), its log-prob and the entropy."""
        logp = self(turn, previous)
        strategy = draw(logp.exp(), torch.rand(len(previous), generator=generator))
        return strategy, logp.gather(1, strategy[:, None]).squeeze(1), entropy_nats(logp.exp())

    def describe(self, game: Game) -> dict[str, dict[str, dict[str, float]]]:
        """The policy as nested dicts (turn -> previous act -> strategy -> probability), for reports."""
        probs = self.logits.detach().softmax(-1)
        previous_names = [*game.acts, "(start)"]
        return {
            f"turn {t}": {previous_names[u]: dict(zip(game.strategies, map(float, probs[t, u]))) for u in range(probs.shape[1])}
            for t in range(probs.shape[0])
        }
