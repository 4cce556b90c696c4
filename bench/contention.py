"""Two jobs on one machine: a training step alone, and beside another busy training process.

People run two seeds, or a training run beside an evaluation, on one machine. Torch's threads spin
while they wait for each other, so two processes that each take every core collapse (a step went from
45 s to 702 s). The trainer's thread governor (``scope_marl.core.machine.ThreadGovernor``) takes the
cores the other processes leave free, checked every step.

This measures one ``scope train`` step (the embedded model, Persuasion for Good with synthetic
personas, 16 dialogues of 3 exchanges a step) alone, then again while a second ``scope train`` process on the same
config trains beside it (started first, given time to reach its steps). Both use the governor
(``threads`` unset); ``--threads N`` fixes both at N instead, the behaviour before it (torch's
default was one thread per core).

    python bench/contention.py [--steps 2] [--threads N]

Ends with: RESULT alone_s=A contended_s=C slowdown=S competitor_slowdown=K threads_alone=TA
threads_contended=TC (competitor_slowdown: the other process's slowest step after its first, which it
ran alone, over A)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from scope_marl.config import TrainConfig
from scope_marl.core.machine import machine_line

CONFIG = {
    "model": "embedded",
    "env": {"name": "p4g", "source": "synthetic", "max_exchanges": 3},
    "agent_sampling": {"temperature": 1.0, "max_new_tokens": 48},
    "simulator": {"mode": "frozen", "model": "embedded", "sampling": {"temperature": 1.0, "max_new_tokens": 48}},
    "lora": {"r": 8, "alpha": 16},
    "rollout": {"group_size": 4, "on_turn_limit": "continue", "progress": False},
    "tasks_per_step": 4,
    "checkpoint_every": 1000,
    "seed": 0,
}


def step_times(cfg: dict, steps: int, out: Path) -> tuple[list[float], int]:
    """Train ``steps`` steps in this process; each step's wall time, and the threads the last one used."""
    import torch

    from scope_marl.experiment import start

    trainer = start(TrainConfig.model_validate({**cfg, "steps": steps}), out)
    times = []
    try:
        for _ in range(steps):
            clock = time.perf_counter()
            trainer.train_step()
            times.append(time.perf_counter() - clock)
        return times, torch.get_num_threads()
    finally:
        trainer.close()


def competitor_steps(folder: Path) -> list[float]:
    lines = (folder / "metrics.jsonl").read_text().splitlines() if (folder / "metrics.jsonl").exists() else []
    return [json.loads(x)["rollout_s"] + json.loads(x)["update_s"] for x in lines]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="steps timed per condition (the last one is quoted)")
    parser.add_argument("--threads", type=int, default=None, help="fix both processes' threads (unset: the governor)")
    args = parser.parse_args()
    cfg = {**CONFIG, **({"threads": args.threads} if args.threads else {})}
    work = Path(tempfile.mkdtemp(prefix="contention-"))
    print(machine_line())
    alone, threads_alone = step_times(cfg, args.steps, work / "alone")
    print(f"alone: steps {[round(t, 1) for t in alone]} s on {threads_alone} thread(s)", flush=True)

    (work / "other.yaml").write_text(yaml.safe_dump({**cfg, "steps": 1000}))
    log = (work / "other.log").open("wb")
    other = subprocess.Popen(
        [sys.executable, "-m", "scope_marl.cli", "train", str(work / "other.yaml"), "--out", str(work / "other")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        while len(competitor_steps(work / "other")) < 1:  # it is past loading and into its steps
            if other.poll() is not None:
                raise SystemExit(f"the competing process exited; see {work / 'other.log'}")
            time.sleep(1)
        contended, threads_contended = step_times(cfg, args.steps, work / "contended")
        print(f"beside another run: steps {[round(t, 1) for t in contended]} s on {threads_contended} thread(s)", flush=True)
    finally:
        os.killpg(other.pid, signal.SIGTERM)
        other.wait(60)
    theirs = competitor_steps(work / "other")
    a, c = alone[-1], contended[-1]
    k = max(theirs[1:], default=float("nan"))  # its slowest step after the first (those ran beside this process)
    print(f"competitor's steps: {[round(t, 1) for t in theirs]} s")
    print(
        f"RESULT alone_s={a:.1f} contended_s={c:.1f} slowdown={c / a:.2f} competitor_slowdown={k / a:.2f} "
        f"threads_alone={threads_alone} threads_contended={threads_contended}"
    )


if __name__ == "__main__":
    main()
