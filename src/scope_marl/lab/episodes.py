"""Playing whole batches of lab dialogues as tensors.

A batch is ``groups x group_size`` episodes; all episodes of a group share the persona (the task)
and, through ``simulator.for_group``, the simulator that plays the user, so the GRPO baseline
compares like with like. Groups that drew the same simulator answer in one call per turn.
Each episode is one stream per role: the agent's strategy choices and the user's acts, one per
turn, ``mask`` marking the real turns (a dialogue may end early on a terminal act).

The agent is anything with ``choose(turn, previous, alive, generator) -> (strategy, logp, entropy)``:
the tabular :class:`StrategyPolicy`, or the LLM agent of ``llm_agent.py`` (which writes a message per
live dialogue and classifies it), so both are played by this one loop. An LLM message may play no
strategy at all (strategy ``-1``, the classifier's ``other``): the simulator is not asked, the user
says the game's ``unclear_act`` instead (the turn is spent without persuading), and such turns are
left out of the simulator's own updates (:attr:`Dialogues.user_turns`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from scope_marl.lab.games import Game
from scope_marl.lab.simulators import ActTurn, batch_turn
from scope_marl.simulators.base import Simulator


class Agent(Protocol):
    def choose(self, turn: int, previous: Tensor, alive: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        """The strategy of every dialogue this turn [n], its log-prob [n] and the policy's entropy [n]
        (rows that are no longer ``alive`` are ignored)."""
        ...


@dataclass
class Dialogues:
    persona: Tensor  # [n] assigned persona
    played: Tensor  # [n] the persona the user was played as (differs when a simulator ignores its persona)
    previous: Tensor  # [n, T] the user's previous act before each agent turn
    strategies: Tensor  # [n, T]
    acts: Tensor  # [n, T]
    mask: Tensor  # [n, T] bool, real turns
    agent_logp: Tensor  # [n, T] log-prob of the sampled strategy at sampling time
    agent_entropy: Tensor  # [n, T] entropy of the policy at each turn
    user_logp: Tensor  # [n, T] log-prob of the act under the simulator that said it
    rewards: Tensor  # [n] the agent's reward (the donation outcome)
    group_ids: list[str]  # [n]
    simulators: list[str]  # one simulator id per group

    @property
    def user_turns(self) -> Tensor:
        """[n, T] bool: the turns the simulator answered (real turns whose message played a strategy)."""
        return self.mask & (self.strategies >= 0)

    def mean_entropy(self) -> float:
        return float(self.agent_entropy[self.mask].mean())


def play(
    game: Game,
    policy: Agent,
    simulator: Simulator,
    personas: Tensor,
    group_size: int,
    generator: torch.Generator,
    first_group: int = 0,
    unclear_act: int | None = None,
) -> Dialogues:
    """``len(personas)`` groups of ``group_size`` dialogues; group g faces ``simulator.for_group(first_group + g)``.

    ``unclear_act`` is the user's act after a message that played no strategy (strategy ``-1``);
    an agent that can return ``-1`` must name it.
    """
    if unclear_act is not None and bool(game.terminal[unclear_act]):
        raise ValueError(f"unclear_act {game.acts[unclear_act]!r} ends the dialogue; an unclear message must not end it")
    groups = len(personas)
    n, T = groups * group_size, game.turns
    persona = personas.repeat_interleave(group_size)
    members = [simulator.for_group(first_group + g) for g in range(groups)]
    rows_of: dict[int, list[int]] = {}
    for g, member in enumerate(members):
        rows_of.setdefault(id(member), []).extend(range(g * group_size, (g + 1) * group_size))
    by_id = {id(m): m for m in members}
    # One bucket covering everything (a single simulator) skips the row indexing.
    buckets = [(by_id[k], None if len(rows) == n else torch.tensor(rows)) for k, rows in rows_of.items()]

    persona_draw = torch.rand(n, generator=generator)
    previous = torch.full((n,), game.start)
    alive = torch.ones(n, dtype=torch.bool)
    played = persona.clone()
    record = {
        name: torch.zeros(n, T, dtype=dtype)
        for name, dtype in (
            ("previous", torch.long),
            ("strategies", torch.long),
            ("acts", torch.long),
            ("mask", torch.bool),
            ("agent_logp", torch.float),
            ("agent_entropy", torch.float),
            ("user_logp", torch.float),
        )
    }
    with torch.no_grad():
        for t in range(T):
            strategy, logp, entropy = policy.choose(t, previous, alive, generator)
            unclear = strategy < 0
            if unclear.any() and unclear_act is None:
                raise ValueError("the agent played no strategy (-1) but play() was given no unclear_act for the user's reply")
            # Every row is still asked (as strategy 0 where unclear), so the simulators' random
            # streams do not depend on what the agent wrote; the unclear rows' answers are replaced.
            asked = strategy.clamp_min(0)
            acts = torch.empty(n, dtype=torch.long)
            user_logp = torch.empty(n)
            for member, rows in buckets:
                pick = slice(None) if rows is None else rows
                context = ActTurn(t, persona[pick], previous[pick], asked[pick], persona_draw[pick], generator)
                response = member.respond([batch_turn(context, game)])[0]
                acts[pick] = response.reply
                user_logp[pick] = response.info["logp"]
                if t == 0:
                    played[pick] = response.info["played"]
            if unclear.any():
                acts[unclear] = unclear_act
                user_logp[unclear] = 0.0
            record["previous"][:, t] = previous
            record["strategies"][:, t] = strategy
            record["acts"][:, t] = acts
            record["mask"][:, t] = alive
            record["agent_logp"][:, t] = logp
            record["agent_entropy"][:, t] = entropy
            record["user_logp"][:, t] = user_logp
            previous = torch.where(alive, acts, previous)
            alive = alive & ~game.terminal[acts]
            if not alive.any():
                break
    rewards = game.outcome(record["acts"], record["mask"])
    group_ids = [str(first_group + g) for g in range(groups) for _ in range(group_size)]
    return Dialogues(
        persona=persona, played=played, rewards=rewards, group_ids=group_ids, simulators=[m.simulator_id for m in members], **record
    )
