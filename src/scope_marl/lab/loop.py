"""The collapse lab's training loop: one arm, one seed, with the *shared* GRPO loss of the LLM path.

The agent (a :class:`StrategyPolicy`) and, in co-training, the trainable simulator are updated by
:func:`group_advantages` and :func:`policy_loss` on the lab's tensors. Every ``eval_every`` steps the
policy plays each held-out simulator with fixed seeds (all arms and steps see the same users).
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import torch

from scope_marl.lab.arms import Settings, opponent
from scope_marl.lab.episodes import Dialogues, play
from scope_marl.lab.games import Game
from scope_marl.lab.policy import StrategyPolicy
from scope_marl.lab.simulators import TrainableActs, entropy_nats
from scope_marl.training.losses import group_advantages, policy_loss

EVAL_SEED = 10_007  # evaluation users are the same for every arm, seed and step (common random numbers)


def update_agent(policy: StrategyPolicy, optimizer: torch.optim.Optimizer, d: Dialogues, s: Settings) -> dict:
    """One GRPO step of the agent: each episode is a stream of its strategy choices."""
    advantages = group_advantages(d.rewards, d.group_ids)
    turn = torch.arange(d.strategies.shape[1]).expand_as(d.strategies)
    logp = policy(turn, d.previous)  # [n, T, S]
    new = logp.gather(-1, d.strategies[..., None]).squeeze(-1)
    reference = torch.full_like(new, -math.log(logp.shape[-1]))  # the initial policy is uniform
    loss, stats = policy_loss(
        new, d.agent_logp, advantages, d.mask.float(), ref_logp=reference, entropy=entropy_nats(logp.exp()), kl_coef=s.kl_coef
    )
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    # One update per batch: the recomputed log-probs equal the sampled ones (on-policy exactness).
    stats["on_policy_gap"] = float((new.detach() - d.agent_logp)[d.mask].abs().max())
    return stats


def update_simulator(simulator: TrainableActs, optimizer: torch.optim.Optimizer, d: Dialogues, s: Settings) -> dict:
    """One GRPO step of the trainable user on its own turns, rewarded 1 - r (adversarial, as in P4G).

    Under population co-training the turns were played by pool members: ``d.user_logp`` is then the
    member's log-prob and the clipped ratio corrects for the difference, as in PPO.
    """
    advantages = group_advantages(1.0 - d.rewards, d.group_ids)
    played = d.played[:, None].expand_as(d.acts)
    # Only the turns the simulator answered are its own (an LLM agent's unclear message, strategy -1,
    # got the game's fixed reply instead); the clamp only keeps the masked-out lookups in range.
    new, reference = simulator.log_probs(played, d.previous, d.strategies.clamp_min(0), d.acts)
    loss, stats = policy_loss(new, d.user_logp, advantages, d.user_turns.float(), ref_logp=reference, kl_coef=s.sim_kl_coef)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return stats


def evaluate(game: Game, policy: StrategyPolicy, panel: list, s: Settings) -> dict:
    """Mean reward and policy entropy against each panel member, then their means over the panel."""
    per_simulator, entropies = {}, []
    for index, (name, simulator, weights) in enumerate(panel):
        generator = torch.Generator().manual_seed(EVAL_SEED + index)
        personas = torch.multinomial(weights, s.eval_groups, replacement=True, generator=generator)
        d = play(game, policy, simulator, personas, s.eval_group_size, generator)
        per_simulator[name] = float(d.rewards.mean())
        entropies.append(d.mean_entropy())
    return {
        "reward": sum(per_simulator.values()) / len(per_simulator),
        "entropy": sum(entropies) / len(entropies),
        "per_simulator": per_simulator,
    }


def train_arm(game: Game, arm: str, seed: int, s: Settings, panel: list) -> dict:
    """Train one arm with one seed; returns its curve (every ``eval_every`` steps) and final point."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    policy = StrategyPolicy(game)
    optimizer = torch.optim.Adam(policy.parameters(), lr=s.lr)
    curve, rewards, gaps = [], [], []
    with tempfile.TemporaryDirectory(prefix="scope-lab-") as tmp:
        opp = opponent(arm, game, s, seed, Path(tmp))
        sim_optimizer = torch.optim.Adam([opp.trainable.logits], lr=s.sim_lr) if opp.trainable else None

        def point(step: int) -> None:
            held_out = evaluate(game, policy, panel, s)
            window = rewards[-s.eval_every :] if step else rewards[:1]
            curve.append(
                {
                    "step": step,
                    "train_reward": sum(window) / len(window),
                    "heldout_reward": held_out["reward"],
                    "policy_entropy": held_out["entropy"],
                    "per_simulator": held_out["per_simulator"],
                }
            )

        for step in range(s.steps):
            personas = torch.multinomial(game.weights, s.groups, replacement=True, generator=generator)
            d = play(game, policy, opp.simulator, personas, s.group_size, generator, first_group=step * s.groups)
            rewards.append(float(d.rewards.mean()))
            if step == 0:
                point(0)
            gaps.append(update_agent(policy, optimizer, d, s)["on_policy_gap"])
            if opp.trainable is not None:
                update_simulator(opp.trainable, sim_optimizer, d, s)
            if opp.pool is not None and (step + 1) % s.pool_every == 0:
                opp.pool.add(opp.trainable.save(Path(tmp) / f"staging-{step + 1}"), step=step + 1)
            if (step + 1) % s.eval_every == 0 or step + 1 == s.steps:
                point(step + 1)
    return {
        "arm": arm,
        "seed": seed,
        "curve": curve,
        "final": curve[-1],
        "start": curve[0],
        "max_on_policy_gap": max(gaps),
        "policy": policy.describe(game),
    }
