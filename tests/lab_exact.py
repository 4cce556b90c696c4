"""Exact expected reward of a strategy policy by dynamic programming: no sampling, no seeds.

For games whose outcome is the last-act term only (``theory``), the pair (persona played,
previous act) is a Markov state, so the expected reward is a sum over turns of the probability of
ending there times what that ending is worth. This is the paper's formal argument in code: the
policy that is best against a collapsed simulator can be computed and played against humans.
Training never uses it, so it lives with the tests: the design check of the theory game
(tests/test_lab.py) uses it, and docs/lab.md quotes it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from scope_marl.lab.games.game import Game


def played_weights(game: Game, weights: Tensor, adherence: float) -> Tensor:
    """Persona distribution actually played when a share ``1 - adherence`` of episodes fall back to the modal persona."""
    modal = torch.zeros_like(weights)
    modal[game.modal_persona] = 1.0
    return adherence * weights + (1.0 - adherence) * modal


def expected_reward(game: Game, policy: Tensor, table: Tensor, weights: Tensor) -> Tensor:
    """E[reward] of ``policy`` [T, U + 1, S] (probabilities) against reply ``table`` [P, U + 1, S, U]
    with persona distribution ``weights`` [P]. Differentiable in ``policy``."""
    outcome = game.outcome
    if outcome.intercept != 0 or bool(outcome.any_act.any()):
        raise ValueError(f"exact evaluation needs an outcome of the last act only; game {game.name} has other terms")
    alive = torch.zeros(len(game.personas), len(game.acts) + 1)
    alive[:, game.start] = weights
    continuing = (~game.terminal).float()
    total = torch.zeros(())
    for t in range(game.turns):
        # p(persona, act said at turn t), summed over previous acts and strategies.
        said = torch.einsum("pu,us,pusa->pa", alive, policy[t], table)
        ends = torch.ones_like(continuing) if t == game.turns - 1 else 1.0 - continuing
        total = total + (said * ends * outcome.last_act * outcome.discount**t).sum()
        alive = torch.zeros_like(alive)
        alive[:, : len(game.acts)] = said * continuing
    return total


def best_policy(game: Game, table: Tensor, weights: Tensor, steps: int = 300, lr: float = 0.15) -> Tensor:
    """The policy (probabilities [T, U + 1, S]) that maximizes :func:`expected_reward`, by gradient ascent."""
    logits = torch.zeros(game.turns, len(game.acts) + 1, len(game.strategies), requires_grad=True)
    optimizer = torch.optim.Adam([logits], lr=lr)
    for _ in range(steps):
        loss = -expected_reward(game, logits.softmax(-1), table, weights)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return logits.detach().softmax(-1)
