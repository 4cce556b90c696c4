"""Regenerate docs/example_report/: the demo's three arms trained longer, with periodic panel evaluation.

    python scripts/example_report.py --steps 6 --out runs/example && cp -r runs/example/report docs/example_report

Each arm (single frozen simulator, Verbalized Sampling, population co-training) trains the agent's
LoRA adapter on the embedded SmolLM2-135M for ``--steps`` GRPO steps and plays the built-in offline
panel (2 test tasks x 1 sample per simulator) every ``--eval-every`` steps; ``scope report``'s
code then draws the curves and bars. About 4 minutes per arm at 6 steps on 2 CPU cores.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scope_marl.demo import ARMS, arm_config, demo_panel
from scope_marl.evaluation.report import write_report
from scope_marl.experiment import start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("runs/example"))
    args = parser.parse_args()
    panel = demo_panel()
    for arm in ARMS:
        cfg = arm_config(arm, args.steps)
        cfg.eval = cfg.eval.model_copy(
            update={"every": args.eval_every, "tasks": panel.tasks_per_simulator, "group_size": 1, "panel": "offline"}
        )
        print(f"[{arm}] training {args.steps} steps, evaluating every {args.eval_every}")
        start(cfg, args.out / arm).run()
    report = write_report(
        [args.out / arm for arm in ARMS], args.out / "report", title=f"Demo arms, {args.steps} GRPO steps on SmolLM2-135M"
    )
    print(report.read_text())
    print(f"report: {report}")


if __name__ == "__main__":
    main()
