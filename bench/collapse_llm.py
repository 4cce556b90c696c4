"""Collapse with a real LLM policy: the theory game's collapse lab with SmolLM2-135M-Instruct as the agent.

Runs ``scope lab --policy llm`` in full (arms single, vs_prob and cotrain, 3 seeds, the LLM settings of
``scope_marl.lab.arms.LLM_SETTINGS``: the warm-started agent with the KL anchor), prints the table, then one line:

    RESULT seeds=S steps=N single_train_change=A single_heldout_change=B vs_prob_over_single=V
    vs_prob_over_single_low=VL cotrain_over_single=C cotrain_over_single_low=CL entropy_single=ES
    entropy_vs_prob=EV seconds=T gemm_gflops=G

The changes are final minus the untrained agent (step 0), means over seeds; "over single" is the
final held-out reward minus single's, paired by seed, with the lower end of its 95% t-interval;
entropies are the final entropy (nats) of the agent's classified strategies. ``seconds`` is the
training and evaluation time summed over every session that worked on ``--out`` (the run resumes
where it stopped when started again with the same ``--out``). Budget: 2 hours on a 2-core machine
at 150 GFLOP/s.

Run: python bench/collapse_llm.py [--out runs/bench-collapse-llm] [--quick] [--seeds 3] [--arms single,vs_prob,...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scope_marl.lab.llm_run import LLM_ARMS, run_llm_lab
from scope_marl.lab.report import format_llm_table

RESULT_ARMS = ("single", "vs_prob", "cotrain")  # what the RESULT line compares (the budget in docs/lab.md is for these)


def result_line(results: dict) -> str:
    r = results["results"]

    def over_single(arm: str) -> tuple[float, float]:
        stats = r[arm]["heldout_vs_single"]
        return stats["mean"], stats["low"]

    vs, vs_low = over_single("vs_prob")
    co, co_low = over_single("cotrain")
    return (
        f"RESULT seeds={results['seeds']} steps={results['settings']['steps']} "
        f"single_train_change={r['single']['change']['train_reward']['mean']:.4f} "
        f"single_heldout_change={r['single']['change']['heldout_reward']['mean']:.4f} "
        f"vs_prob_over_single={vs:.4f} vs_prob_over_single_low={vs_low:.4f} "
        f"cotrain_over_single={co:.4f} cotrain_over_single_low={co_low:.4f} "
        f"entropy_single={r['single']['final']['strategy_entropy']['mean']:.4f} "
        f"entropy_vs_prob={r['vs_prob']['final']['strategy_entropy']['mean']:.4f} "
        f"seconds={results['seconds']:.0f} gemm_gflops={results['gemm_gflops']:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/bench-collapse-llm"), help="run directory (resumed if it exists)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--arms", default=",".join(RESULT_ARMS), help=f"comma-separated, of {', '.join(LLM_ARMS)}; the RESULT line needs these three"
    )
    parser.add_argument("--quick", action="store_true", help="the --quick setting (minutes; not the benchmark)")
    args = parser.parse_args()
    results = run_llm_lab("theory", args.arms.split(","), args.seeds, args.out, quick=args.quick)
    print(format_llm_table(results))
    print(result_line(results))


if __name__ == "__main__":
    main()
