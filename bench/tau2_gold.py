"""tau2-bench's reward through our engine, episode format and conversion, against tau2's own evaluator.

Per domain, one line:

    RESULT domain=D split=S tasks=N gold=G empty=E empty_tau2=T noop=K errors=X agree=A

- gold: mean reward when scripted players replay the task's gold actions through OUR engine (calls
  written as Hermes text, parsed, executed, recorded, converted to tau2 and scored). Target 1.000.
  A task without gold actions, or whose scoring raises, is counted in errors (with its reason), not scored.
- empty / empty_tau2: the agent that greets and does nothing, scored by us and by tau2's
  evaluate_simulation on the trajectory built directly from tau2's classes (target: equal).
- noop: tasks on which that empty agent scores 1 (the right answer is to change nothing).
- agree: the share of perturbed trajectories (a gold action dropped, an argument changed, a
  communicate string removed, a wrong termination, a malformed call), built as tau2 messages,
  converted into our messages, replayed through our engine and converted back, on which our reward
  equals tau2's evaluator on the original (target 1.000).

Usage: python bench/tau2_gold.py [--domains retail,airline,telecom,mock] [--limit N]
"""

from __future__ import annotations

import argparse
import copy
import time
from statistics import fmean

from scope_marl.core.types import EpisodeStatus
from scope_marl.envs.tau2 import Tau2
from scope_marl.envs.tau2.convert import from_tau2
from scope_marl.envs.tau2.env import count_steps
from scope_marl.envs.tau2.trajectories import empty, gold, perturbed, plan_of, tau2_score
from scope_marl.evaluation.replay import replay

SPLITS = {"retail": "test", "airline": "base", "telecom": "test", "mock": "base"}


def ours(env: Tau2, task, trajectory) -> tuple[float | None, str | None]:
    """Our reward for a tau2 trajectory replayed through the engine (None and the reason when it failed)."""
    messages = from_tau2(trajectory.messages)
    if trajectory.termination == "max_steps":  # the user never stops: the step cap ends it where tau2's did
        env = copy.copy(env)  # shares the loaded tasks
        env.max_steps = count_steps(messages[len(env.opening(task)) :])
    episode = replay(env, task, messages)
    if episode.status != EpisodeStatus.COMPLETED:
        return None, episode.error
    if episode.metadata.get("termination") != trajectory.termination:
        return None, f"ended {episode.metadata.get('termination')}, expected {trajectory.termination}"
    return episode.rewards["agent"], None


def run_domain(domain: str, limit: int | None, log) -> dict:
    env = Tau2(domain)
    split = SPLITS[domain]
    tasks = env.tasks(split)[:limit]
    golds, empties, empties_tau2, agree, errors = [], [], [], [], []
    started = time.perf_counter()
    for task in tasks:
        tau2_task = env.task_of(task)
        try:
            e_ours, why = ours(env, task, empty(tau2_task))
            e_tau2 = tau2_score(domain, tau2_task, empty(tau2_task))
        except Exception as err:  # tau2's evaluator itself raises on some tasks
            errors.append(f"{task.task_id}: tau2's evaluator raised on the empty trajectory ({type(err).__name__}: {err})")
            continue
        if e_ours is None:
            errors.append(f"{task.task_id}: empty replay {why}")
            continue
        empties.append(e_ours)
        empties_tau2.append(e_tau2)
        if not plan_of(tau2_task):
            errors.append(f"{task.task_id}: no gold actions")
            continue
        g, why = ours(env, task, gold(domain, tau2_task))
        if g is None:
            errors.append(f"{task.task_id}: gold replay {why}")
            continue
        golds.append(g)
        for trajectory in perturbed(domain, tau2_task):
            mine, why = ours(env, task, trajectory)
            theirs = tau2_score(domain, tau2_task, trajectory)
            agree.append(mine == theirs)
            if mine != theirs:
                log(f"  disagree {task.task_id} {trajectory.name}: ours {mine} ({why or 'scored'}) tau2 {theirs}")
    for line in errors:
        log(f"  error {line}")
    log(f"  {domain}: {len(tasks)} tasks in {time.perf_counter() - started:.0f} s")
    return {
        "domain": domain,
        "split": split,
        "tasks": len(tasks),
        "gold": fmean(golds) if golds else float("nan"),
        "empty": fmean(empties) if empties else float("nan"),
        "empty_tau2": fmean(empties_tau2) if empties_tau2 else float("nan"),
        "noop": sum(1 for e in empties if e == 1.0),
        "errors": len(errors),
        "agree": fmean(agree) if agree else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--domains", default="retail,airline,telecom,mock")
    parser.add_argument("--limit", type=int, default=None, help="only the first N tasks of each split")
    args = parser.parse_args()
    for domain in args.domains.split(","):
        r = run_domain(domain, args.limit, log=lambda s: print(s, flush=True))
        print(
            f"RESULT domain={r['domain']} split={r['split']} tasks={r['tasks']} gold={r['gold']:.3f} empty={r['empty']:.3f} "
            f"empty_tau2={r['empty_tau2']:.3f} noop={r['noop']} errors={r['errors']} agree={r['agree']:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
