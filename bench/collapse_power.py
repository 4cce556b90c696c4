"""How big must the LLM collapse experiment be to see the effect? A power calculation on the tabular lab.

The tabular lab plays the same game (theory), the same simulators and the same reward noise as the
LLM lab; only the agent is a table of strategy logits instead of a language model. It stands in for
the experiment: for each budget (dialogues per step x steps) it replays the LLM experiment's design
many times (``--replicates`` independent experiments of 3 seeds each: single-simulator training,
evaluated at step 0 and at the end on ``eval_groups x 4`` dialogues per panel simulator, the training
reward at the end being the mean of the last half of the steps' batches, as the LLM lab measures
them with ``eval_every`` = half the steps) and counts how often the two halves of the collapse claim come out with 95%
t-intervals away from 0 over the 3 seeds:

- ``rise``: the training reward rises (final minus step 0, interval above 0);
- ``fall``: the held-out reward falls (interval below 0);
- ``both``: the two in the same experiment (the power of the claim).

Held-out here means the VALIDATION panel: the budget is a design choice, and choices are made on the
validation panel only. The tabular agent starts uniform over the strategies, as the warm-started LLM
agent does (each strategy sampled at a useful rate); its learning rate (``--lr``, Adam on the
logits) stands in for how fast GRPO moves the LLM's strategy choice, which is the main uncertainty:
the table is printed for each.

    python bench/collapse_power.py [--replicates 40] [--lr 0.03,0.1]

Ends with one line per learning rate: RESULT lr=L smallest_budget=DxN dialogues=T power=P (the
smallest total number of dialogues per run whose power for ``both`` is at least 0.8; none: no budget
in the grid reaches it).
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch

from scope_marl.evaluation.stats import t_interval
from scope_marl.lab.arms import SETTINGS
from scope_marl.lab.games import load_game
from scope_marl.lab.loop import train_arm
from scope_marl.lab.panel import VALIDATION_PANEL, build_panel, load_panel

GROUP_SIZE = 4  # the LLM lab's dialogues per GRPO group
DIALOGUES = (16, 32, 64)  # per step
STEPS = (12, 24, 36, 48)
EVAL_GROUPS = 2  # per panel simulator, as the LLM lab evaluates (x GROUP_SIZE dialogues)
SEEDS = 3
POWER = 0.8


def experiment(game, panel, dialogues: int, steps: int, lr: float, first_seed: int) -> tuple[bool, bool]:
    """One replicate of the LLM experiment's design: (training reward rose, held-out fell), each with
    its 95% interval over the seeds away from 0."""
    s = SETTINGS["theory"].replace(
        steps=steps, groups=dialogues // GROUP_SIZE, group_size=GROUP_SIZE, lr=lr, eval_every=steps // 2, eval_groups=EVAL_GROUPS,
        eval_group_size=GROUP_SIZE,
    )  # fmt: skip
    runs = [train_arm(game, "single", first_seed + k, s, panel) for k in range(SEEDS)]
    rise = t_interval([r["final"]["train_reward"] - r["start"]["train_reward"] for r in runs])
    fall = t_interval([r["final"]["heldout_reward"] - r["start"]["heldout_reward"] for r in runs])
    return rise["low"] > 0, fall["high"] < 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=40)
    parser.add_argument("--lr", default="0.03,0.1", help="the tabular agent's Adam learning rates to try (comma-separated)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    game = load_game("theory")
    panel = build_panel(game, load_panel(VALIDATION_PANEL))
    started = time.perf_counter()
    results = []
    for lr in (float(x) for x in args.lr.split(",")):
        print(f"\nlr {lr}: share of {args.replicates} replicate experiments ({SEEDS} seeds each) with the interval away from 0")
        print(f"{'dialogues/step':>15}{'steps':>7}{'dialogues':>11}{'rise':>7}{'fall':>7}{'both':>7}")
        table = []
        for dialogues, steps in itertools.product(DIALOGUES, STEPS):
            outcomes = [experiment(game, panel, dialogues, steps, lr, 1000 + SEEDS * r) for r in range(args.replicates)]
            rise = sum(a for a, _ in outcomes) / len(outcomes)
            fall = sum(b for _, b in outcomes) / len(outcomes)
            both = sum(a and b for a, b in outcomes) / len(outcomes)
            table.append((dialogues, steps, both))
            print(f"{dialogues:>15}{steps:>7}{dialogues * steps:>11}{rise:>7.2f}{fall:>7.2f}{both:>7.2f}")
        enough = sorted((d * n, d, n, p) for d, n, p in table if p >= POWER)
        results.append((lr, enough[0] if enough else None))
    print(f"\n{time.perf_counter() - started:.0f} s")
    for lr, best in results:
        if best is None:
            print(f"RESULT lr={lr} smallest_budget=none dialogues=none power=none")
        else:
            total, d, n, p = best
            print(f"RESULT lr={lr} smallest_budget={d}x{n} dialogues={total} power={p:.2f}")


if __name__ == "__main__":
    main()
