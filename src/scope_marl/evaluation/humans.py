"""How human-like is a user simulator? Its P4G donations and replies against the corpus's humans.

On a seeded subset of one split's corpus personas (validation by default), each simulator plays the
persuadee against the same agent (the base model, same seeds), and we compare:

- its donation distribution (each episode's donation as ``episode_donation`` reads it) with the
  humans' actual donations on the same personas, as total variation distance over the bins
  ``0``, ``(0, 0.5]``, ``(0.5, 1]``, ``(1, 2]`` dollars (0 = identical, 1 = disjoint);
- the distinct-2 of its replies (word bigrams, unique / all) beside the humans' own turns.

``scope eval --humans NAME=SPEC`` (repeatable) prints them side by side.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path

from scope_marl.assembly import ModelCache, build_env, build_simulator
from scope_marl.backends.seat import Seat
from scope_marl.config import P4GConfig, RolloutConfig, SimulatorConfig
from scope_marl.core import files
from scope_marl.core.types import SamplingParams
from scope_marl.envs import USER
from scope_marl.evaluation.diversity import distinct_n
from scope_marl.rollout import RolloutEngine

BINS = ((0.0, 0.0), (0.0, 0.5), (0.5, 1.0), (1.0, 2.0))  # (low, high]; the first is exactly 0
BIN_LABELS = ["0", "(0, 0.5]", "(0.5, 1]", "(1, 2]"]


def histogram(amounts: Sequence[float]) -> list[float]:
    """Shares of ``amounts`` (dollars, clamped to [0, 2]) in :data:`BINS`."""
    counts = [0] * len(BINS)
    for a in amounts:
        a = min(max(a, 0.0), 2.0)
        counts[0 if a == 0 else next(i for i, (low, high) in enumerate(BINS) if i and low < a <= high)] += 1
    return [c / len(amounts) for c in counts] if amounts else [0.0] * len(BINS)


def total_variation(p: Sequence[float], q: Sequence[float]) -> float:
    return 0.5 * sum(abs(a - b) for a, b in zip(p, q))


def simulators_vs_humans(
    simulators: dict[str, SimulatorConfig],
    env_cfg: P4GConfig | None = None,
    agent: str = "embedded",
    tasks: int = 16,
    split: str = "validation",
    seed: int = 0,
    agent_sampling: SamplingParams | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """Each simulator's donation histogram, its TV distance to the humans', and distinct-2."""
    from scope_marl.envs.p4g.corpus import read_dialogues

    env = build_env(env_cfg or P4GConfig(name="p4g", source="corpus", max_exchanges=3, word_limit=30))
    if getattr(env, "corpus_dir", None) is None:
        raise ValueError("comparing simulators with humans needs the P4G corpus: set $SCOPE_P4G_DIR (or env.data_dir)")
    chosen = list(env.tasks(split))
    random.Random(seed).shuffle(chosen)
    chosen = chosen[:tasks]
    human_amounts = [min(max(t.data["human"]["persuadee_donation"], 0.0), 2.0) for t in chosen]  # as episode_donation clamps
    dialogues = read_dialogues(env.corpus_dir)
    human_turns = [m.content for t in chosen for m in dialogues.get(t.task_id, []) if m.role == USER and m.content]
    human_hist = histogram(human_amounts)
    models = ModelCache()
    sampling = agent_sampling or SamplingParams(temperature=0.7, top_p=0.95, max_new_tokens=32)
    rows = {}
    for name, cfg in simulators.items():
        log(f"{name}: {len(chosen)} {split} personas")
        seat = Seat(model=models.get(agent), sampling=sampling, trainable=False)
        rollout = RolloutConfig(group_size=1, seed=seed, on_turn_limit="continue", progress=False)
        episodes = RolloutEngine(env, seat, build_simulator(cfg, models), rollout).run(chosen)
        amounts = [env.donation(e.messages) for e in episodes]
        hist = histogram(amounts)
        replies = [m.content for e in episodes for m in e.messages if m.role == USER]
        rows[name] = {
            "spec": cfg.model_dump(mode="json"),
            "episodes": len(episodes),
            "failed": sum(e.status.value != "COMPLETED" for e in episodes),
            "mean_donation": sum(amounts) / len(amounts) if amounts else None,
            "histogram": hist,
            "donation_tv": total_variation(hist, human_hist),
            "distinct2": distinct_n(replies, 2),
        }
    return {
        "split": split,
        "tasks": len(chosen),
        "seed": seed,
        "bins": BIN_LABELS,
        "humans": {
            "mean_donation": sum(human_amounts) / len(human_amounts),
            "histogram": human_hist,
            "distinct2": distinct_n(human_turns, 2),
        },
        "simulators": rows,
    }


def markdown(results: dict) -> str:
    head = ["", "mean donation", *[f"share {b}" for b in results["bins"]], "donation TV to humans", "distinct-2"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def row(name, r, tv):
        cells = [
            name,
            f"{r['mean_donation']:.3f}",
            *[f"{x:.2f}" for x in r["histogram"]],
            tv,
            f"{r['distinct2']:.3f}" if r["distinct2"] is not None else "-",
        ]
        return "| " + " | ".join(cells) + " |"

    lines.append(row("humans (corpus)", results["humans"], "0"))
    for name, r in results["simulators"].items():
        lines.append(row(name, r, f"{r['donation_tv']:.3f}"))
    return (
        f"Simulators against the humans on {results['tasks']} {results['split']} personas (seed {results['seed']})\n\n"
        + "\n".join(lines)
        + "\n"
    )


def write(results: dict, out: Path) -> Path:
    files.write_json(out / "humans.json", results)
    return files.write_text(out / "humans.md", markdown(results))
