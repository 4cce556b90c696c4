"""The collapse lab's tables, checks and plot: what ``scope lab`` prints and writes.

Every cell is a mean over seeds with its 95% t-interval; the checks read the paper's claims off the
intervals (does single-simulator RL collapse, and which arms beat it?).
"""

from __future__ import annotations

import json
from pathlib import Path

from scope_marl.evaluation.report import PANELS, plot_collapse
from scope_marl.evaluation.stats import format_interval

# The table's columns after the arm: (part of the summary, metric, signed), then held-out minus single.
COLUMNS = [(part, key, part == "change") for key in ("train_reward", "heldout_reward", "policy_entropy") for part in ("final", "change")]


def table_rows(results: dict, columns: list[tuple[str, str, bool]] = COLUMNS) -> list[list[str]]:
    return [
        [arm, *(format_interval(r[part][key], signed) for part, key, signed in columns), format_interval(r.get("heldout_vs_single"), True)]
        for arm, r in results["results"].items()
    ]


def text_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned plain-text columns under a dashed rule."""
    rows = [header, *rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


HEADER = ["arm", "train reward", "change", "held-out reward", "change", "policy entropy", "change", "held-out - single"]


def _verdict(stats: dict, up: str, down: str) -> str:
    if stats["low"] > 0:
        return up
    if stats["high"] < 0:
        return down
    return "no clear change (interval spans 0)"


def checks(results: dict) -> list[str]:
    """The paper's claims, read off the intervals: does single-simulator RL collapse, and which arms beat it?"""
    r = results["results"]
    lines = []
    if "single" in r:
        change = r["single"]["change"]
        lines.append(
            f"single: training-simulator reward {format_interval(change['train_reward'], True)}: "
            + _verdict(change["train_reward"], "rises", "falls")
        )
        lines.append(
            f"single: held-out reward {format_interval(change['heldout_reward'], True)}: "
            + _verdict(change["heldout_reward"], "rises", "falls")
        )
        lines.append(
            f"single: policy entropy {format_interval(change['policy_entropy'], True)}: "
            + _verdict(change["policy_entropy"], "rises", "falls")
        )
        for arm, stats in r.items():
            if arm != "single" and stats.get("heldout_vs_single"):
                diff = stats["heldout_vs_single"]
                note = " (reference only: oracle trains on the human model)" if arm == "oracle" else ""
                lines.append(
                    f"{arm} vs single, held-out {format_interval(diff, True)}: "
                    + _verdict(diff, "beats single", "worse than single")
                    + note
                )
    return lines


def format_table(results: dict) -> str:
    """The per-arm table as plain text, then the checks (what ``scope lab`` prints)."""
    lines = [
        (
            f"game {results['game']}: {results['seeds']} seeds, mean [95% t-interval over seeds]; "
            f"held-out panel '{results['panel']['name']}' ({len(results['panel']['simulators'])} simulators); "
            "change = final - step 0"
        ),
        *text_table(HEADER, table_rows(results)),
    ]
    return "\n".join(lines + [""] + checks(results))


def headline(results: dict) -> list[str]:
    """The lab's finding in plain sentences: single's collapse, then how far each fix ends above single."""
    r = results["results"]
    if "single" not in r:
        return []
    change = r["single"]["change"]
    lines = [
        f"Trained against one collapsed simulator (single), the agent's reward against that simulator changes by "
        f"{format_interval(change['train_reward'], True)}, while its reward against the held-out panel changes by "
        f"{format_interval(change['heldout_reward'], True)} and its policy entropy by {format_interval(change['policy_entropy'], True)}."
    ]
    names = {
        "rotation": "rotation over three LLMs",
        "vs_prob": "Verbalized Sampling (prob)",
        "vs_random": "Verbalized Sampling (random)",
        "cotrain": "co-training",
        "population": "population co-training",
    }
    gains = [
        f"{names.get(arm, arm)} {format_interval(stats['heldout_vs_single'], True)}"
        for arm, stats in r.items()
        if arm != "single" and arm != "oracle" and stats.get("heldout_vs_single")
    ]
    if gains:
        lines.append("Held-out reward above single, paired by seed: " + "; ".join(gains) + ".")
    return lines


def report_markdown(results: dict, level: int = 1, images: str = "") -> str:
    """The lab's report; ``level`` is its top heading's depth and ``images`` the folder of
    ``collapse.png`` relative to the markdown file (so ``scope demo`` can hold it as a section)."""
    game, h = results["game"], "#" * level
    lines = [
        f"{h} Collapse lab: `{game}`",
        "",
        (
            f"{results['seeds']} seeds per arm; every cell is the mean over seeds with its {results['interval']}. "
            f"Held-out panel: `{results['panel_file']}` ({len(results['panel']['simulators'])} simulators, never used to "
            "choose anything). *change* is final minus step 0; *held-out - single* is paired by seed."
        ),
        "",
        *headline(results),
        "",
        f"![collapse curves: training-simulator reward, held-out reward and policy entropy per step]({images}collapse.png)",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    names = [s["id"] for s in results["panel"]["simulators"]]
    lines += ["", f"{h}# Final held-out reward per simulator", "", "| arm | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for arm, r in results["results"].items():
        lines.append(f"| {arm} | " + " | ".join(format_interval(r["per_simulator"][n]) for n in names) + " |")
    lines += ["", f"{h}# Checks", ""] + [f"- {line}" for line in checks(results)]
    lines += ["", f"{h}# Settings", ""] + [f"- `{key}`: {json.dumps(value)}" for key, value in results["settings"].items()]
    lines += ["", "Modelling choices: docs/lab.md in the SCOPE-MARL repository.", ""]
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    """The collapse curves of every arm (bands: t-intervals over seeds), with the LLM path's plot code."""
    plot_collapse(
        {arm: r["curve"] for arm, r in results["results"].items()},
        path,
        title=f"Collapse lab: {results['game']} ({results['seeds']} seeds, 95% t-intervals)",
    )


# ---- the LLM-policy lab (scope lab --policy llm) -------------------------------------------------
LLM_HEADER = [
    "arm",
    "train reward",
    "change",
    "held-out reward",
    "change",
    "strategy entropy",
    "change",
    "distinct-2",
    "other",
    "held-out - single",
]
LLM_PANELS = [
    *PANELS[:2],
    ("strategy_entropy", "Entropy of the agent's strategies", "nats over classified messages"),
    ("distinct2", "Distinct-2 of the agent's messages", "unique bigrams / bigrams"),
]


LLM_COLUMNS = [
    *COLUMNS[:4],
    ("final", "strategy_entropy", False),
    ("change", "strategy_entropy", True),
    ("final", "distinct2", False),
    ("final", "other_share", False),
]


def format_llm_table(results: dict) -> str:
    """The LLM lab's per-arm table as plain text (what ``scope lab --policy llm`` prints)."""
    title = f"game {results['game']}, LLM agent: {results['seeds']} seeds, mean [95% t-interval over seeds]; change = final - step 0"
    return "\n".join([title, *text_table(LLM_HEADER, table_rows(results, LLM_COLUMNS))])


def llm_report_markdown(results: dict) -> str:
    """The LLM lab's report: table, per-simulator rewards, strategy shares and example messages."""
    start = results["start"]
    lines = [
        f"# Collapse lab with an LLM agent: `{results['game']}`",
        "",
        (
            f"The agent writes each message with the embedded LLM and a LoRA adapter; a fixed classifier maps it to a strategy "
            f"and the lab's act simulators answer. {results['seeds']} seeds per arm; every cell is the mean over seeds with its "
            f"{results['interval']}. Held-out panel: `{results['panel_file']}`. *other* is the share of messages the classifier "
            "could not place (answered as a uniformly drawn strategy)."
        ),
        "",
        f"Untrained agent (step 0, every arm): held-out reward {start['heldout_reward']:.3f}, strategy entropy "
        f"{start['strategy_entropy']:.3f}, distinct-2 {start['distinct2']:.3f}, strategy shares "
        + ", ".join(f"{k} {v:.2f}" for k, v in start["strategy_shares"].items())
        + ".",
        "",
        "![collapse curves of the LLM agent](collapse.png)",
        "",
        "| " + " | ".join(LLM_HEADER) + " |",
        "|" + "---|" * len(LLM_HEADER),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results, LLM_COLUMNS)]
    names = [s["id"] for s in results["panel"]["simulators"]]
    lines += ["", "## Final held-out reward per simulator", "", "| arm | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for arm, r in results["results"].items():
        lines.append(f"| {arm} | " + " | ".join(format_interval(r["per_simulator"][n]) for n in names) + " |")
    lines += ["", "## Example messages (held-out evaluation, seed 0)", ""]
    for arm, examples in results["examples"].items():
        lines += (
            [f"### {arm}", "", "Start:", ""]
            + _example_lines(examples["start"][:2])
            + ["", "End:", ""]
            + _example_lines(examples["end"][0][:2])
            + [""]
        )
    lines += ["## Settings", ""] + [f"- `{key}`: {json.dumps(value)}" for key, value in results["settings"].items()]
    lines += ["", f"Time: {results['seconds']:.0f} s of training and evaluation at {results['gemm_gflops']:.0f} GFLOP/s GEMM.", ""]
    return "\n".join(lines)


def _example_lines(examples: list[dict]) -> list[str]:
    return [f"- [{s}] {m!r}" for e in examples for m, s in zip(e["messages"], e["strategies"])]


def plot_llm(results: dict, path: Path) -> None:
    plot_collapse(
        {arm: r["curve"] for arm, r in results["results"].items()},
        path,
        title=f"Collapse lab, LLM agent: {results['game']} ({results['seeds']} seeds, 95% t-intervals)",
        panels=LLM_PANELS,
    )
