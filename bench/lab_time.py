"""Time the collapse lab: both games' default tables (all six arms, 5 seeds) on this machine.

Runs ``run_lab`` for ``theory`` and then ``p4g`` exactly as ``scope lab`` does (default panel,
default settings, one torch thread), prints each game's table, then one RESULT line per game,
``p4g`` last. Targets on the 2-core machine: theory < 60 s, both < 120 s. Rewards are fractions
of the $2 payment (0-1); entropies in nats; ``*_heldout`` is the mean over the held-out panel.

Run: python bench/lab_time.py [--seeds 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from scope_marl.lab import format_table, run_lab


def result_line(results: dict, seconds: float) -> str:
    r = results["results"]

    def final(arm: str, key: str) -> str:
        return f"{r[arm]['final'][key]['mean']:.4f}" if arm in r else "nan"

    return (
        f"RESULT game={results['game']} seconds={seconds:.1f} single_train={final('single', 'train_reward')} "
        f"single_heldout={final('single', 'heldout_reward')} vs_heldout={final('vs_prob', 'heldout_reward')} "
        f"cotrain_heldout={final('cotrain', 'heldout_reward')} population_heldout={final('population', 'heldout_reward')} "
        f"single_entropy={final('single', 'policy_entropy')} cotrain_entropy={final('cotrain', 'policy_entropy')}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="keep the reports here (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lab-bench-") as tmp:
        root = args.out or Path(tmp)
        lines, total = [], 0.0
        for game in ("theory", "p4g"):
            started = time.perf_counter()
            results = run_lab(game, seeds=args.seeds, out=root / game, log=lambda _: None)
            seconds = time.perf_counter() - started
            total += seconds
            print(format_table(results))
            print()
            lines.append(result_line(results, seconds))
        print(f"total {total:.1f}s for both games (targets: theory < 60 s, both < 120 s)")
        for line in lines:
            print(line)


if __name__ == "__main__":
    main()
