"""Choose the lab's hyperparameters on the VALIDATION panel (never on the held-out one).

    python -m scope_marl.lab.tune --game theory [--seeds 5] [--out tune.json]

Seeds 100, 101, ... (disjoint from the report's seeds 0, 1, ...), the validation panel
``validation`` panel (no member shared with the held-out ``heldout`` panel), and the
final mean validation reward as the score. Three stages, each fixing what it chose:

1. the agent's learning rate, scored by the mean over the frozen-simulator arms (single,
   rotation, vs_prob, vs_random), so that no arm is favoured;
2. the co-training simulator's learning rate and KL coefficient, on the cotrain arm;
3. the pool snapshot interval, on the population arm.

The winners are copied by hand into ``arms.SETTINGS`` (docs/lab.md records the last output).
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch

from scope_marl.core import files
from scope_marl.lab.arms import SETTINGS, Settings
from scope_marl.lab.games import GAMES, load_game
from scope_marl.lab.loop import train_arm
from scope_marl.lab.panel import VALIDATION_PANEL, build_panel, load_panel

# The agent's learning rates stop at 0.3: at 1.0 Adam makes the tabular policy deterministic within
# ~15 updates (entropy ~0), so every arm becomes a lottery over deterministic policies, unlike any
# LLM run, whose entropy declines over hundreds of steps.
GRID = {
    "lr": (0.03, 0.1, 0.3),
    "sim": list(itertools.product((0.03, 0.1, 0.3), (0.1, 0.2, 0.5, 1.0, 2.0))),  # (sim_lr, sim_kl_coef)
    "pool_every": (5, 10, 15, 30),
}
FROZEN_ARMS = ("single", "rotation", "vs_prob", "vs_random")


def score(game, arms, s: Settings, panel, seeds) -> float:
    values = [train_arm(game, arm, seed, s, panel)["final"]["heldout_reward"] for arm in arms for seed in seeds]
    return sum(values) / len(values)


def tune(game_name: str, seeds: int = 5, log=print) -> dict:
    torch.set_num_threads(1)
    game = load_game(game_name)
    panel = build_panel(game, load_panel(VALIDATION_PANEL))
    seed_list = [100 + i for i in range(seeds)]
    s = SETTINGS[game_name]
    report: dict = {"game": game_name, "panel": VALIDATION_PANEL, "seeds": seed_list, "stages": {}}

    def stage(name, arms, candidates, apply):
        nonlocal s
        scores = {}
        for value in candidates:
            scores[value] = score(game, arms, apply(s, value), panel, seed_list)
            log(f"[tune {game_name}] {name}={value}: validation reward {scores[value]:.4f} ({', '.join(arms)})")
        best = max(scores, key=scores.get)
        s = apply(s, best)
        report["stages"][name] = {"arms": list(arms), "scores": {str(k): v for k, v in scores.items()}, "chosen": best}

    stage("lr", FROZEN_ARMS, GRID["lr"], lambda s, v: s.replace(lr=v))
    stage("sim_lr,sim_kl_coef", ("cotrain",), GRID["sim"], lambda s, v: s.replace(sim_lr=v[0], sim_kl_coef=v[1]))
    stage("pool_every", ("population",), GRID["pool_every"], lambda s, v: s.replace(pool_every=v))
    report["chosen"] = {"lr": s.lr, "sim_lr": s.sim_lr, "sim_kl_coef": s.sim_kl_coef, "pool_every": s.pool_every}
    log(f"[tune {game_name}] chosen: {report['chosen']}")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", choices=GAMES, default="theory")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="write the scores and choices as JSON here")
    args = parser.parse_args()
    report = tune(args.game, args.seeds)
    if args.out:
        files.write_text(args.out, json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
