"""``scope lab``: every arm over several seeds on one game, summarized with t-intervals over seeds.

Writes ``results.json``, ``report.md``, ``report.html`` and ``collapse.png``; the run reports reward against its
training simulator, held-out reward and policy entropy, each as a mean over seeds with a 95%
t-interval.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from scope_marl.config.loading import resolve_named
from scope_marl.core import files
from scope_marl.evaluation.report import write_html
from scope_marl.evaluation.stats import t_interval
from scope_marl.lab.arms import ARMS, OPTIONAL_ARMS, SETTINGS, Settings
from scope_marl.lab.games import load_game
from scope_marl.lab.loop import train_arm
from scope_marl.lab.panel import BUILTIN_DIR, HELDOUT_PANEL, build_panel, load_panel
from scope_marl.lab.report import plot, report_markdown

METRICS = ("train_reward", "heldout_reward", "policy_entropy")


def summarize(runs: list[dict], metrics: tuple[str, ...] = METRICS) -> dict:
    """Per metric: the final value, its change since step 0, both over seeds; the mean curve with bands."""
    out: dict = {"final": {}, "change": {}}
    for key in metrics:
        out["final"][key] = t_interval([r["final"][key] for r in runs])
        out["change"][key] = t_interval([r["final"][key] - r["start"][key] for r in runs])
    names = runs[0]["final"]["per_simulator"]
    out["per_simulator"] = {name: t_interval([r["final"]["per_simulator"][name] for r in runs]) for name in names}
    curve = []
    for i, p in enumerate(runs[0]["curve"]):
        point = {"step": p["step"]}
        for key in metrics:
            stats = t_interval([r["curve"][i][key] for r in runs])
            point.update({key: stats["mean"], f"{key}_low": stats["low"], f"{key}_high": stats["high"]})
        curve.append(point)
    out["curve"] = curve
    return out


def checked_arms(arms, allowed: tuple[str, ...], seeds: int) -> list[str]:
    """The arms as a list, after checking every arm is known and there is at least one seed."""
    unknown = [a for a in arms if a not in allowed]
    if unknown:
        raise ValueError(f"unknown arm(s) {unknown}; choose from {list(allowed)}")
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    return list(arms)


def paired_with_single(per_arm: dict) -> None:
    """Each arm's final held-out reward minus single's, paired by seed, as ``summary["heldout_vs_single"]``."""
    if "single" not in per_arm:
        return
    base = {r["seed"]: r["final"]["heldout_reward"] for r in per_arm["single"]["runs"]}
    for arm, result in per_arm.items():
        diffs = [r["final"]["heldout_reward"] - base[r["seed"]] for r in result["runs"] if r["seed"] in base]
        result["summary"]["heldout_vs_single"] = t_interval(diffs) if arm != "single" else None


def run_lab(
    game: str = "theory",
    arms: list[str] | None = None,
    seeds: int = 5,
    panel: str | Path | None = None,
    out: Path = Path("lab"),
    log: Callable[[str], None] = print,
    settings: Settings | None = None,
) -> dict:
    """Train every arm with ``seeds`` seeds on ``game`` and write results.json, report.md, collapse.png to ``out``.

    ``panel`` is a held-out panel: a YAML path or a built-in name (default ``heldout``); ``settings``
    replaces the game's tuned hyperparameters (shorter runs in tests). Returns the results dict that
    :func:`scope_marl.lab.report.format_table` prints.
    """
    started = time.perf_counter()
    arms = checked_arms(arms or ARMS, ARMS + OPTIONAL_ARMS, seeds)
    lab_game = load_game(game)
    s = settings or SETTINGS[game]
    panel_spec = load_panel(panel if panel is not None else HELDOUT_PANEL)
    members = build_panel(lab_game, panel_spec)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads cost more than they give, and runs are comparable
    try:
        per_arm = {}
        for arm in arms:
            runs = []
            for seed in range(seeds):
                t0 = time.perf_counter()
                run = train_arm(lab_game, arm, seed, s, members)
                runs.append(run)
                f = run["final"]
                log(
                    f"[lab {game}] {arm:10s} seed {seed}: train {f['train_reward']:.3f}  held-out {f['heldout_reward']:.3f}  "
                    f"entropy {f['policy_entropy']:.3f}  ({time.perf_counter() - t0:.1f}s)"
                )
            per_arm[arm] = {"summary": summarize(runs), "runs": runs}
    finally:
        torch.set_num_threads(threads)

    paired_with_single(per_arm)
    results = {
        "game": game,
        "arms": arms,
        "seeds": seeds,
        "settings": s.model_dump(mode="json"),
        "panel": panel_spec.model_dump(),
        "panel_file": panel_file(panel),
        "game_notes": lab_game.notes,
        "interval": "95% Student-t interval over seeds",
        "results": {arm: r["summary"] for arm, r in per_arm.items()},
        "runs": {arm: [{k: v for k, v in run.items() if k != "curve"} for run in r["runs"]] for arm, r in per_arm.items()},
        "seconds": time.perf_counter() - started,
    }
    files.write_text(out / "results.json", json.dumps(results, indent=1) + "\n")
    plot(results, out / "collapse.png")
    files.write_text(out / "report.md", report_markdown(results))
    write_html(out / "report.md", f"Collapse lab: {game}")
    results["seconds"] = time.perf_counter() - started
    return results


def panel_file(panel: str | Path | None) -> str:
    """How results name the panel: a built-in one by its package path (not this machine's), else as given."""
    if panel is not None and Path(panel).exists():
        return str(panel)
    path = resolve_named(panel if panel is not None else HELDOUT_PANEL, BUILTIN_DIR)
    return f"scope_marl/lab/panels/{path.name}" if path is not None else str(panel)
