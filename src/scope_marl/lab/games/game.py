"""A lab game: who the users are, how a human user replies, and what a dialogue earns.

Both lab games (``theory`` and ``p4g``) are one :class:`Game`: the agent picks a persuasion
*strategy* each turn, the user answers with an *act*, and the episode's reward is the donation
outcome read from the user's acts. Everything is a small tensor, so whole batches of dialogues are
simulated at once (see ``episodes.py``).

Indexing conventions used throughout the lab:

- ``reply[persona, previous_act, strategy]`` is the human distribution over the next act; the
  previous act is ``game.start`` (== number of acts) before the user has spoken.
- a persona is a *type* of user (the task); the population weights say how common each is, and the
  most common one is the *modal persona* a collapsed simulator falls back to.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass(frozen=True)
class Outcome:
    """The donation outcome of a dialogue as a reward in [0, 1]:

        r = clamp(intercept + sum_a seen[a] * any_act[a] + last_act[a_last] * discount ** t_last, 0, 1)

    ``seen[a]`` is 1 when the user said act ``a`` at least once, ``a_last`` is the user's last act and
    ``t_last`` the turn it was said at (0-based). ``theory`` uses only the last-act term (an
    agreement ends the dialogue, and an earlier one is worth more); ``p4g`` uses the fitted
    intercept and ``any_act`` weights. Only the user's acts count, as in the LLM path, where the
    reward is read from what the user said.
    """

    intercept: float
    any_act: Tensor  # [U]
    last_act: Tensor  # [U]
    discount: float = 1.0

    def __call__(self, acts: Tensor, mask: Tensor) -> Tensor:
        """Rewards [n] of dialogues with acts [n, T] on their real turns mask [n, T]."""
        n_acts = self.any_act.shape[0]
        real = mask.bool()
        # Padded turns add 0 to act 0: harmless.
        seen = torch.zeros(acts.shape[0], n_acts).scatter_add_(1, torch.where(real, acts, 0), real.float())
        reward = self.intercept + (seen.clamp(max=1.0) * self.any_act).sum(1)
        length = real.sum(1)
        t_last = (length - 1).clamp(min=0)
        last = acts.gather(1, t_last[:, None]).squeeze(1)
        reward = reward + torch.where(length > 0, self.last_act[last] * self.discount ** t_last.float(), 0.0)
        return reward.clamp(0.0, 1.0)


@dataclass(frozen=True)
class Game:
    name: str
    strategies: tuple[str, ...]  # the agent's choices
    acts: tuple[str, ...]  # the user's replies
    personas: tuple[str, ...]  # user types (the tasks)
    weights: Tensor  # [P] the human population's persona shares (sums to 1)
    reply: Tensor  # [P, U + 1, S, U] human reply model p(act | persona, previous act, strategy)
    turns: int  # agent turns per dialogue (each followed by one user act)
    terminal: Tensor  # [U] bool: acts that end the dialogue
    outcome: Outcome
    vs_k: int = 5  # candidates a Verbalized Sampling simulator lists (see simulators.VerbalizedActs)
    notes: dict = field(default_factory=dict)  # provenance and modelling choices, for the report

    def __post_init__(self) -> None:
        P, U, S = len(self.personas), len(self.acts), len(self.strategies)
        if tuple(self.reply.shape) != (P, U + 1, S, U):
            raise ValueError(f"{self.name}: reply table has shape {tuple(self.reply.shape)}, expected {(P, U + 1, S, U)}")
        if not torch.allclose(self.reply.sum(-1), torch.ones(P, U + 1, S), atol=1e-5):
            raise ValueError(f"{self.name}: every reply distribution must sum to 1")
        if abs(float(self.weights.sum()) - 1.0) > 1e-5 or (self.weights < 0).any():
            raise ValueError(f"{self.name}: persona weights must be non-negative and sum to 1, got {self.weights.tolist()}")

    @property
    def start(self) -> int:
        """The 'previous act' index before the user's first reply."""
        return len(self.acts)

    def persona_index(self, name: str) -> int:
        return self.personas.index(name)

    @property
    def modal_persona(self) -> int:
        return int(self.weights.argmax())
