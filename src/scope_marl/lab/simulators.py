"""Lab user simulators: the same simulator protocol as the LLM path, with discrete acts as replies.

Every class here is a :class:`scope_marl.simulators.base.Simulator` whose reply is a tensor of acts.
To stay vectorized, one :class:`SimulatorTurn` carries a whole batch of pending user turns: its
``context`` is an :class:`ActTurn` of tensors, and the answer is one ``Response(reply=acts, info)``
with the acts' log-probabilities (``logp``) and the persona each episode was played as (``played``).
Rotation (``scope_marl.simulators.rotation.Rotation``) and the snapshot pool
(``scope_marl.simulators.pool.SimulatorPool``) are used as they are; ``for_group`` picks one
simulator per GRPO group exactly as in the LLM path.

The simulators model how LLM users differ from people:

- **human** (:meth:`FrozenActs.sharpened` with gamma = 1, adherence = 1) is the game's reply model.
- **collapsed LLM** (gamma > 1): ``p(act)**gamma / Z`` (mode collapse sharpens the reply
  distribution), and with probability ``1 - adherence`` per *episode* it ignores the persona it was
  given and plays the modal persona (a collapsed LLM drifts to its default character for the whole
  conversation, not turn by turn).
- **Verbalized Sampling** (:class:`VerbalizedActs`) asks such a simulator for k candidates.
- **trainable** (:class:`TrainableActs`): a table of logits initialized to a frozen simulator's
  distribution, trained by the shared GRPO loss with a KL to that initial distribution.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from scope_marl.core.seeds import derive_seed
from scope_marl.envs.base import Task
from scope_marl.lab.games import Game
from scope_marl.simulators.base import Response, Simulator, SimulatorTurn
from scope_marl.simulators.candidates import (
    Candidate,
    candidate_entropy,
    draw_candidate,
)
from scope_marl.simulators.pool import SimulatorPool

SNAPSHOT_FILE = "simulator.pt"
# The VS paper reports that verbalizing recovers 66.8% of the base model's pre-alignment diversity;
# we model the residual collapse as a third of the excess (gamma - 1, and 1 - adherence).
VS_RESIDUAL = 1.0 / 3.0
# Stated probabilities are the true ones times exp(noise * N(0, 1)): roughly calibrated, +-35%.
VS_NOISE = 0.3


def sharpen(probs: Tensor, gamma: float) -> Tensor:
    """p**gamma / Z over the last dimension: gamma = 1 is p itself, gamma -> inf is the mode."""
    if not gamma > 0:
        raise ValueError(f"gamma must be > 0, got {gamma}")
    return torch.softmax(gamma * probs.clamp_min(1e-30).log(), dim=-1) * (probs > 0)


def draw(weights: Tensor, uniforms: Tensor) -> Tensor:
    """Index per row, drawn in proportion to ``weights`` [n, k] with one uniform per row [n].

    The batched twin of :func:`scope_marl.simulators.candidates.draw_candidate`: the first
    cumulative weight above ``u * total`` (bisect_right), and the last positive weight where the
    product rounds up to the total. Float64 like Python's floats, so both pick the same index for
    the same uniform (tests/test_lab.py checks it).
    """
    weights = weights.double()
    cumulative = weights.cumsum(-1)
    index = torch.searchsorted(cumulative, (uniforms.double() * cumulative[:, -1])[:, None], right=True).squeeze(1)
    last_positive = torch.where(weights > 0, torch.arange(weights.shape[1]), -1).amax(1)
    return torch.minimum(index, last_positive)


def entropy_nats(probs: Tensor) -> Tensor:
    """Shannon entropy over the last dimension (0 log 0 = 0)."""
    return -(probs * probs.clamp_min(1e-30).log()).sum(-1)


@dataclass
class ActTurn:
    """A batch of pending user turns (the ``context`` of one lab :class:`SimulatorTurn`)."""

    turn: int
    persona: Tensor  # [n] the persona each episode's user was given (the task)
    previous: Tensor  # [n] the user's previous act (game.start before the first reply)
    strategy: Tensor  # [n] the agent's strategy this turn
    persona_draw: Tensor  # [n] one uniform per episode, drawn at its start: does the user keep to its persona?
    generator: torch.Generator


def batch_turn(context: ActTurn, game: Game) -> SimulatorTurn:
    return SimulatorTurn(episode_id=f"{game.name}:turn{context.turn}", task=Task(task_id=f"lab:{game.name}"), context=context)


class ActSimulator(Simulator[Tensor]):
    """Replies drawn from a table ``[persona, previous act, strategy] -> p(act)`` for the played persona."""

    def __init__(self, game: Game, adherence: float, simulator_id: str):
        if not 0.0 <= adherence <= 1.0:
            raise ValueError(f"adherence must be in [0, 1], got {adherence}")
        self.game = game
        self.adherence = adherence
        self.simulator_id = simulator_id

    def table(self) -> Tensor:
        raise NotImplementedError

    def played(self, context: ActTurn) -> Tensor:
        return torch.where(context.persona_draw < self.adherence, context.persona, self.game.modal_persona)

    def distribution(self, context: ActTurn) -> tuple[Tensor, Tensor]:
        """p(act) [n, U] for each pending turn, and the persona each episode is played as [n]."""
        played = self.played(context)
        return self.table()[played, context.previous, context.strategy], played

    def respond(self, turns: Sequence[SimulatorTurn]) -> list[Response[Tensor]]:
        return [self.answer(turn.context) for turn in turns]

    def answer(self, context: ActTurn) -> Response[Tensor]:
        probs, played = self.distribution(context)
        acts = draw(probs, torch.rand(len(probs), generator=context.generator))
        return Response(acts, {"logp": probs.gather(1, acts[:, None]).squeeze(1).log(), "played": played})

    def identity(self) -> dict:
        return {"id": self.simulator_id, "adherence": self.adherence}


class FrozenActs(ActSimulator):
    """A fixed reply table: the human model, a gamma-sharpened LLM, or a pool snapshot."""

    def __init__(self, game: Game, table: Tensor, adherence: float = 1.0, simulator_id: str = "frozen", gamma: float | None = None):
        super().__init__(game, adherence, simulator_id)
        self._table = table
        self.gamma = gamma

    @classmethod
    def sharpened(cls, game: Game, gamma: float = 1.0, adherence: float = 1.0, simulator_id: str | None = None) -> FrozenActs:
        name = simulator_id or ("human" if gamma == 1.0 and adherence == 1.0 else f"llm(gamma={gamma:g},adherence={adherence:g})")
        return cls(game, sharpen(game.reply, gamma), adherence, name, gamma)

    @classmethod
    def load(cls, game: Game, directory: str | Path, adherence: float, simulator_id: str) -> FrozenActs:
        """A pool snapshot written by :meth:`TrainableActs.save`, played as a frozen simulator."""
        logits = torch.load(Path(directory) / SNAPSHOT_FILE, weights_only=True)["logits"]
        return cls(game, logits.softmax(-1), adherence, simulator_id)

    def table(self) -> Tensor:
        return self._table

    def identity(self) -> dict:
        return {**super().identity(), "gamma": self.gamma}


class VerbalizedActs(ActSimulator):
    """Verbalized Sampling over a sharpened simulator: k candidates with stated probabilities, one drawn.

    Model of what the LLM lists: asked for k *different* replies, it names k distinct acts drawn
    without replacement (Gumbel top-k) from its verbalized distribution. Verbalizing undoes most,
    not all, of the collapse, and we treat both faces of collapse alike, keeping the same share
    ``residual`` of each: ``q = p**gamma_vs / Z`` with ``gamma_vs = 1 + residual * (gamma - 1)``,
    and the modal-persona drift shrinks to ``residual * (1 - adherence)``. It states each
    candidate's probability as ``q(act) * exp(noise * N(0, 1))``. One candidate is then drawn as
    in the LLM path: in proportion to the stated probabilities (``prob``) or uniformly
    (``random``), after the normalization of ``parse_candidates`` (weights renormalized;
    zero-probability candidates are never drawn).

    ``exact=True`` builds real :class:`Candidate` lists and draws each episode with
    :func:`draw_candidate` (and measures :func:`candidate_entropy`); the default batched path
    picks the same candidates from the same uniforms (tested), thousands of times faster.
    """

    def __init__(
        self,
        simulator: FrozenActs,
        k: int | None = None,
        method: str = "prob",
        noise: float = VS_NOISE,
        residual: float = VS_RESIDUAL,
        exact: bool = False,
        simulator_id: str | None = None,
    ):
        if simulator.gamma is None:
            raise ValueError("Verbalized Sampling wraps a gamma-sharpened simulator (FrozenActs.sharpened)")
        if method not in ("prob", "random"):
            raise ValueError(f"VS method must be 'prob' or 'random', got {method!r}")
        game = simulator.game
        self.k = k or game.vs_k
        if not 1 <= self.k <= len(game.acts):
            raise ValueError(f"VS k must be between 1 and the number of acts ({len(game.acts)}), got {self.k}")
        if not 0.0 <= residual <= 1.0:
            raise ValueError(f"VS residual must be in [0, 1], got {residual}")
        adherence = 1.0 - residual * (1.0 - simulator.adherence)
        super().__init__(game, adherence, simulator_id or f"vs-{method}(k={self.k}):{simulator.simulator_id}")
        self.method, self.noise, self.exact = method, noise, exact
        self.gamma_vs = 1.0 + residual * (simulator.gamma - 1.0)
        self._table = sharpen(game.reply, self.gamma_vs)

    def table(self) -> Tensor:
        return self._table

    def candidates(self, context: ActTurn) -> tuple[Tensor, Tensor, Tensor]:
        """Candidate acts [n, k], their stated weights [n, k] and the played personas [n]."""
        q, played = self.distribution(context)
        gumbel = -torch.log(-torch.log(torch.rand(q.shape, generator=context.generator).clamp_min(1e-12)))
        acts = (q.clamp_min(1e-30).log() + gumbel).topk(self.k, dim=1).indices
        listed = q.gather(1, acts)
        if self.method == "random":
            # The prompt asks for texts only; every usable candidate weighs the same.
            weights = (listed > 0).float()
        else:
            weights = listed * torch.exp(self.noise * torch.randn(acts.shape, generator=context.generator))
        return acts, weights / weights.sum(1, keepdim=True), played

    def answer(self, context: ActTurn) -> Response[Tensor]:
        acts, weights, played = self.candidates(context)
        uniforms = torch.rand(len(acts), generator=context.generator)
        if self.exact:
            choice, entropy = self._draw_exact(acts, weights, uniforms)
        else:
            choice = draw(weights, uniforms)
            entropy = entropy_nats(weights)
        reply = acts.gather(1, choice[:, None]).squeeze(1)
        # Probability of the drawn act under the listing, as the agent-side record of this turn.
        logp = weights.gather(1, choice[:, None]).squeeze(1).log()
        return Response(reply, {"logp": logp, "played": played, "candidate_entropy": float(entropy.mean())})

    def _draw_exact(self, acts: Tensor, weights: Tensor, uniforms: Tensor) -> tuple[Tensor, Tensor]:
        names = self.game.acts
        choices, entropies = [], []
        for row_acts, row_weights, u in zip(acts.tolist(), weights.tolist(), uniforms.tolist()):
            listing = [Candidate(names[a], w) for a, w in zip(row_acts, row_weights)]
            choices.append(draw_candidate(listing, _FixedUniform(u)))
            entropies.append(candidate_entropy(listing))
        return torch.tensor(choices), torch.tensor(entropies)

    def identity(self) -> dict:
        return {**super().identity(), "mode": "verbalized", "k": self.k, "method": self.method, "gamma_vs": self.gamma_vs}


class _FixedUniform(random.Random):
    """A ``random.Random`` whose next ``random()`` is a given number (to replay a batched draw)."""

    def __init__(self, u: float):
        super().__init__(0)
        self.u = u

    def random(self) -> float:
        return self.u


class TrainableActs(ActSimulator):
    """A trainable user: logits per (persona, previous act, strategy), starting as a frozen simulator.

    ``reference`` keeps the initial log-probabilities for the KL term (the LLM path's "base model with
    adapters disabled"). The persona behaviour (adherence) stays that of the starting simulator.
    """

    def __init__(self, start: FrozenActs, simulator_id: str = "trainable"):
        super().__init__(start.game, start.adherence, simulator_id)
        initial = start.table().clamp_min(1e-8).log()
        self.logits = torch.nn.Parameter(initial.clone())
        self.reference = initial.log_softmax(-1)

    def table(self) -> Tensor:
        return self.logits.detach().softmax(-1)

    def log_probs(self, played: Tensor, previous: Tensor, strategy: Tensor, acts: Tensor) -> tuple[Tensor, Tensor]:
        """(current, reference) log-probs of ``acts``, differentiable in the current ones; any shape."""
        index = (played, previous, strategy)
        current = self.logits[index].log_softmax(-1).gather(-1, acts[..., None]).squeeze(-1)
        return current, self.reference[index].gather(-1, acts[..., None]).squeeze(-1)

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        torch.save({"logits": self.logits.detach().clone()}, directory / SNAPSHOT_FILE)
        return directory

    def identity(self) -> dict:
        return {**super().identity(), "mode": "trainable"}


class PopulationActs(Simulator[Tensor]):
    """Population co-training's user side: each group draws one member of a :class:`SimulatorPool`.

    Members are snapshot directories of a :class:`TrainableActs`; a drawn member plays its group as a
    frozen simulator (loaded once and cached by member id, dropped when the pool evicts it).
    """

    def __init__(self, pool: SimulatorPool, game: Game, adherence: float, seed: int = 0):
        self.pool, self.game, self.adherence, self.seed = pool, game, adherence, seed
        self.simulator_id = f"pool:{pool.root.name}"
        self._loaded: dict[str, FrozenActs] = {}

    def for_group(self, group_index: int) -> Simulator[Tensor]:
        # Seeded by (seed, group) as in the LLM path's PopulationSimulator: reproducible draws.
        member = self.pool.select(rng=random.Random(derive_seed(self.seed, group_index)))
        if member.member_id not in self._loaded:
            live = {m.member_id for m in self.pool.members}
            self._loaded = {k: v for k, v in self._loaded.items() if k in live}
            self._loaded[member.member_id] = FrozenActs.load(self.game, member.path, self.adherence, f"pool:{member.member_id}")
        return self._loaded[member.member_id]

    def identity(self) -> dict:
        return {"id": self.simulator_id, "mode": "pool", "members": [m.member_id for m in self.pool.members]}

    def respond(self, turns: Sequence[SimulatorTurn]) -> list[Tensor]:
        raise TypeError("a PopulationActs answers through the member drawn for each group: call for_group(i) first")


__all__ = [
    "ActSimulator",
    "ActTurn",
    "FrozenActs",
    "PopulationActs",
    "TrainableActs",
    "VerbalizedActs",
    "batch_turn",
    "draw",
    "entropy_nats",
    "sharpen",
]
