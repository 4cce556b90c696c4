"""Regenerate docs/example_report/: three LLM arms trained longer than in the demo, with periodic panel evaluation.

    python scripts/example_report.py --steps 6 --out runs/example && cp -r runs/example/report docs/example_report

Each arm (single frozen simulator, Verbalized Sampling, population co-training) trains the agent's
LoRA adapter on the embedded SmolLM2-135M for ``--steps`` GRPO steps on two-exchange Persuasion for
Good dialogues of 32-token turns, and plays the built-in offline panel (2 test tasks x 1 sample per
simulator) every ``--eval-every`` steps; ``scope report``'s code then draws the curves and bars.
About 4 minutes per arm at 6 steps on 2 CPU cores.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scope_marl.demo import arm_config
from scope_marl.evaluation.panel import load_panel
from scope_marl.evaluation.report import write_report
from scope_marl.experiment import start

SAMPLING = {"temperature": 0.7, "top_p": 0.95, "max_new_tokens": 32}
ENV = {"name": "p4g", "max_exchanges": 2, "word_limit": 30}
ARMS = {
    "frozen": {"simulator": {"mode": "frozen", "id": "train-frozen", "model": "embedded", "sampling": SAMPLING}},
    "vs_prob": {
        "simulator": {
            "mode": "vs",
            "id": "train-vs",
            "k": 3,
            "method": "prob",
            "model": "embedded",
            "sampling": {**SAMPLING, "max_new_tokens": 24},
        }
    },
    "population": {
        "simulator": {"mode": "trainable", "id": "train-population", "model": "embedded", "sampling": SAMPLING},
        "trainable_roles": ["agent", "user"],
        "pool": {"every": 1, "max_size": 3},
    },
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("runs/example"))
    args = parser.parse_args()
    load_panel("offline")  # a missing or broken built-in panel fails here, before any training
    for arm, spec in ARMS.items():
        evaluation = {"every": args.eval_every, "tasks": 2, "group_size": 1, "panel": "offline"}
        cfg = arm_config(arm, args.steps, env=ENV, agent_sampling=SAMPLING, learner={"lr": 1e-4, "kl_coef": 0.01}, eval=evaluation, **spec)
        print(f"[{arm}] training {args.steps} steps, evaluating every {args.eval_every}")
        start(cfg, args.out / arm).run()
    report = write_report(
        [args.out / arm for arm in ARMS], args.out / "report", title=f"Demo arms, {args.steps} GRPO steps on SmolLM2-135M"
    )
    print(report.read_text())
    print(f"report: {report}")


if __name__ == "__main__":
    main()
