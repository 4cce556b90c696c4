"""An SFT-ed simulator against the base simulator: validation loss on held-out human persuadee turns,
then how human-like each plays the persuadee on validation personas.

1. ``scope sft`` on the embedded model (LoRA r 16 on every projection): ``--train-turns`` human
   persuadee turns of the TRAIN split (a seeded sample), batch 8, one pass. The validation loss (nats
   per target token) on ``--val-turns`` turns of the VALIDATION split, before and after.
2. The base frozen simulator and the SFT one each play the persuadee against the same base agent
   (same seeds) on ``--tasks`` validation personas (P4G, 3 exchanges, 30-word turns): the total
   variation distance of their donation distribution (``episode_donation``) to the humans' actual
   donations on those personas, and the distinct-2 of their replies.

Ends with exactly one line:

    RESULT train_dialogues=N val_loss_before=L0 val_loss_after=L1 donation_tv_base=TB donation_tv_sft=TS
           distinct2_base=DB distinct2_sft=DS seconds=T gemm_gflops=G

Needs the P4G corpus ($SCOPE_P4G_DIR or ../shared/data/p4g). Sized to finish within 30 minutes on a
2-core machine at 150 GFLOP/s. Usage: python bench/sft_simulator.py [--train-turns N] [--tasks N] [--out DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from scope_marl.config import FrozenSimulatorConfig, P4GConfig, SFTConfig
from scope_marl.core.machine import gemm_gflops
from scope_marl.evaluation.humans import markdown, simulators_vs_humans
from scope_marl.training.sft import start_sft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train-turns", type=int, default=480)
    parser.add_argument("--val-turns", type=int, default=96)
    parser.add_argument("--tasks", type=int, default=32, help="validation personas each simulator plays")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="keep the SFT run here (default: a temporary folder)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gflops = gemm_gflops()
    print(f"GEMM {gflops:.0f} GFLOP/s on {args.threads} threads", flush=True)
    started = time.perf_counter()

    env = P4GConfig(name="p4g", source="corpus", max_exchanges=3, word_limit=30)
    out = args.out or Path(tempfile.mkdtemp(prefix="sft-bench-")) / "run"
    cfg = SFTConfig(
        env=env,
        max_train_turns=args.train_turns,
        max_val_turns=args.val_turns,
        batch_size=8,
        epochs=1.0,
        eval_every=0,
        checkpoint_every=1000,
        threads=args.threads,
    )
    run = start_sft(cfg, out)
    print(f"{len(run.train)} training turns from {run.train_dialogues} dialogues, {len(run.val)} validation turns", flush=True)
    loss_before = run.validation_loss()
    print(f"validation loss before: {loss_before:.4f} ({time.perf_counter() - started:.0f} s)", flush=True)
    records = run.run()
    loss_after = records[-1]["val_loss"]
    print(f"validation loss after: {loss_after:.4f} ({time.perf_counter() - started:.0f} s)", flush=True)

    sampling = {"temperature": 0.7, "top_p": 0.95, "max_new_tokens": 32}
    simulators = {
        "base": FrozenSimulatorConfig(id="base", sampling=sampling),
        "sft": FrozenSimulatorConfig(id="sft", adapter=str(out / "adapter"), sampling=sampling),
    }
    results = simulators_vs_humans(simulators, env, tasks=args.tasks, seed=0, log=lambda m: print(m, flush=True))
    print(markdown(results), flush=True)
    base, sft = results["simulators"]["base"], results["simulators"]["sft"]
    seconds = time.perf_counter() - started
    print(
        f"RESULT train_dialogues={run.train_dialogues} val_loss_before={loss_before:.4f} val_loss_after={loss_after:.4f} "
        f"donation_tv_base={base['donation_tv']:.3f} donation_tv_sft={sft['donation_tv']:.3f} "
        f"distinct2_base={base['distinct2']:.3f} distinct2_sft={sft['distinct2']:.3f} seconds={seconds:.0f} gemm_gflops={gflops:.0f}"
    )


if __name__ == "__main__":
    main()
