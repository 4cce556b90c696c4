"""The cooperative-coding tasks' oracle checks, through the environment's own scorer.

For every feature pair of every built-in task (all splits), CooperBench's scoring (plain git merge,
hidden tests on the merged tree, sandboxed) of three patch pairs:

- gold: the two gold patches. Target: every pair merges cleanly and passes (gold = 1.000), so gold
  is a true upper bound;
- empty: two empty patches. Target: no pair passes (empty = 0.000);
- naive: each feature written without regard to the other (appended at the end of its module).
  ``conflicts`` counts the pairs whose naive patches conflict under a plain merge; ``declared`` the
  pairs the generator says do. Target: conflicts = declared >= 1, and the same pairs.

Ends with: RESULT tasks=N pairs=P gold=G empty=E conflicts=C declared=D

Usage: python bench/coop_oracle.py [--tasks-dir DIR]
"""

from __future__ import annotations

import argparse
import time

from scope_marl.envs.coop import Scorer, load_tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks-dir", default=None, help="tasks in CooperBench's layout (default: the built-in ones)")
    args = parser.parse_args()
    tasks = load_tasks(args.tasks_dir)
    scorer = Scorer()
    started = time.perf_counter()
    gold = empty = conflicts = declared = pairs = 0
    mismatched = []
    print(f"{'task':<24} {'split':<10} {'pair':<5} {'gold':<5} {'empty':<5} {'naive merge':<12} declared")
    for task in tasks:
        for a, b in task.pairs():
            fa, fb = task.feature(a), task.feature(b)
            g = scorer.score_pair(task, (a, b), (fa.patch, fb.patch))
            e = scorer.score_pair(task, (a, b), ("", ""))
            n = scorer.score_pair(task, (a, b), (fa.naive_patch, fb.naive_patch))
            is_declared = (a, b) in task.naive_conflicts
            pairs += 1
            gold += g.success and g.merge == "clean"
            empty += e.success
            conflicts += n.merge == "conflict"
            declared += is_declared
            if (n.merge == "conflict") != is_declared:
                mismatched.append(f"{task.name}:{a},{b}")
            print(f"{task.name:<24} {task.split:<10} {a},{b:<3} {int(g.success):<5} {int(e.success):<5} {n.merge:<12} {is_declared}")
    seconds = time.perf_counter() - started
    print(f"\n{pairs} pairs scored three times each in {seconds:.1f} s (sandbox network isolation: {g.network})")
    if mismatched:
        print("pairs whose naive merge disagrees with the declaration: " + ", ".join(mismatched))
    print(
        f"RESULT tasks={len(tasks)} pairs={pairs} gold={gold / pairs:.3f} empty={empty / pairs:.3f} conflicts={conflicts} declared={declared}"
    )


if __name__ == "__main__":
    main()
