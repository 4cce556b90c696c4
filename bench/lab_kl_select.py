"""Choose the LLM lab's KL coefficient on the validation panel, by a rule fixed before the run.

The second collapse run (docs/lab.md, "Warm start, KL anchor and budget") anchors every arm to the
warm-started policy with the k3 KL. Too small a coefficient and the language degenerates before the
strategy choice moves (the first run's "people people people"); too large and the agent cannot move
at all. The rule: try the candidates from the smallest, each as one single-simulator run (seed 0, the
full LLM setting with the warm start) scored on the *validation* panel, and take the first whose

- language holds: distinct-2 at the end >= 0.6 of the warm-started agent's (step 0), and
- training reward rises: final training reward (mean over the last half of the steps) minus step 0 > 0.

If none passes, the largest candidate is taken (the language matters more than the rise) and the
script says so. The held-out panel is never looked at here.

    python bench/lab_kl_select.py [--out runs/bench-kl-select] [--candidates 0.01,0.05,0.2]

Each candidate's run resumes when started again with the same --out. Ends with:
RESULT kl_coef=K passed=P tried=N distinct2_ratio=D train_change=T seconds=S gemm_gflops=G
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from scope_marl.core.machine import gemm_gflops
from scope_marl.lab.arms import LLM_SETTINGS
from scope_marl.lab.llm_run import run_llm_lab
from scope_marl.lab.panel import VALIDATION_PANEL

DISTINCT2_FLOOR = 0.6  # the issue's degeneration bound: distinct-2 at the end >= 0.6 of step 0


def verdict(results: dict) -> dict:
    """Distinct-2 ratio (end over step 0) and training-reward change of a one-seed single run, and whether both pass."""
    single = results["results"]["single"]
    ratio = single["final"]["distinct2"]["mean"] / max(results["start"]["distinct2"], 1e-9)
    change = single["change"]["train_reward"]["mean"]
    return {"distinct2_ratio": ratio, "train_change": change, "passed": ratio >= DISTINCT2_FLOOR and change > 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/bench-kl-select"))
    parser.add_argument("--candidates", default="0.01,0.05,0.2", help="comma-separated, tried from the smallest")
    args = parser.parse_args()
    candidates = sorted(float(c) for c in args.candidates.split(","))
    base = LLM_SETTINGS["theory"].replace(warm_start=True)
    tried, seconds, chosen = [], 0.0, None
    for kl in candidates:
        out = args.out / f"kl-{kl:g}"
        first = args.out / f"kl-{candidates[0]:g}" / "warm-start"
        if kl != candidates[0] and first.is_dir() and not (out / "warm-start").exists():
            # The warm start depends only on the game and its own settings (identical for every candidate): reuse it.
            shutil.copytree(first, out / "warm-start")
        results = run_llm_lab("theory", ["single"], 1, out, settings=base.replace(kl_coef=kl), panel=VALIDATION_PANEL)
        v = {"kl_coef": kl, **verdict(results)}
        seconds += results["seconds"]
        tried.append(v)
        print(
            f"kl_coef {kl:g}: distinct-2 end/start {v['distinct2_ratio']:.3f}  train change {v['train_change']:+.4f}  passed {v['passed']}"
        )
        if v["passed"]:
            chosen = v
            break
    if chosen is None:
        chosen = tried[-1]
        print(f"no candidate passed: taking the largest, {chosen['kl_coef']:g}")
    (args.out / "choice.json").write_text(json.dumps({"rule": __doc__.split("\n\n")[1], "tried": tried, "chosen": chosen}, indent=1))
    print(
        f"RESULT kl_coef={chosen['kl_coef']:g} passed={int(chosen['passed'])} tried={len(tried)} "
        f"distinct2_ratio={chosen['distinct2_ratio']:.3f} train_change={chosen['train_change']:.4f} "
        f"seconds={seconds:.0f} gemm_gflops={gemm_gflops():.1f}"
    )


if __name__ == "__main__":
    main()
