"""What the KL anchor costs the LLM lab: one GRPO update with and without the reference forward.

The k3 KL to the warm-started policy needs that policy's log-prob of every trained token: one more
forward pass of the model with adapters off per update. This plays one batch of LLM-lab dialogues
(theory, the warm-started agent, 16 dialogues against the collapsed training simulator), then times
the learner's update on the same episodes with ``kl_coef`` 0 and 0.05, alternating, ``--repeats``
times each (a fresh adapter and optimizer each time, so every update does the same work).

    python bench/lab_kl_cost.py [--warm-start runs/lab-warm-start-theory] [--repeats 3]

Ends with: RESULT update_s_no_kl=A update_s_kl=B ratio=R step_s=S gemm_gflops=G (S: the whole lab
step without KL, rollout included, so R's share of a step can be read off)
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from scope_marl.backends import load_backend
from scope_marl.config import LearnerConfig
from scope_marl.core.machine import gemm_gflops
from scope_marl.lab.arms import LLM_SETTINGS, opponent
from scope_marl.lab.episodes import play
from scope_marl.lab.games import load_game
from scope_marl.lab.llm_agent import ROLE, LLMAgent
from scope_marl.lab.llm_loop import reset_adapter
from scope_marl.lab.warm_start import warm_start_model
from scope_marl.training.learner import Learner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm-start", type=Path, default=Path("runs/lab-warm-start-theory"), help="made there once if missing")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    game = load_game("theory")
    s = LLM_SETTINGS["theory"].replace(warm_start=True)
    chat = load_backend(f"hf:{warm_start_model(game, args.warm_start, s.warm_start_lr, s.warm_start_epochs)}")
    reset_adapter(chat, s, seed=0)
    agent = LLMAgent(chat, game, max_new_tokens=s.max_new_tokens, temperature=s.temperature)
    generator = torch.Generator().manual_seed(0)
    opp = opponent("single", game, s, 0, Path("/tmp"))
    started = time.perf_counter()
    personas = torch.multinomial(game.weights, s.groups, replacement=True, generator=generator)
    turns = agent.batch(s.groups * s.group_size, seed=0)
    try:
        d = play(game, turns, opp.simulator, personas, s.group_size, generator, unclear_act=agent.unclear_act)
    finally:
        turns.close()
    episodes = turns.episodes(d.rewards, d.group_ids, d.simulators, s.group_size)
    rollout_s = time.perf_counter() - started
    times: dict[float, list[float]] = {0.0: [], 0.05: []}
    for _ in range(args.repeats):
        for kl in times:
            reset_adapter(chat, s, seed=0)
            learner = Learner(chat, ROLE, ROLE, s.temperature, LearnerConfig(lr=s.lr, kl_coef=kl))
            times[kl].append(learner.step(episodes)["update_s"])
    no_kl, kl = statistics.median(times[0.0]), statistics.median(times[0.05])
    print(f"{'rollout of 16 dialogues (s)':<36}{rollout_s:.2f}")
    print(f"{'update without KL (s, median)':<36}{no_kl:.2f}  {times[0.0]}")
    print(f"{'update with KL 0.05 (s, median)':<36}{kl:.2f}  {times[0.05]}")
    print(
        f"RESULT update_s_no_kl={no_kl:.2f} update_s_kl={kl:.2f} ratio={kl / no_kl:.2f} step_s={rollout_s + no_kl:.2f} "
        f"gemm_gflops={gemm_gflops():.1f}"
    )


if __name__ == "__main__":
    main()
