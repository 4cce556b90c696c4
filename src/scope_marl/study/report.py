"""``scope study report``: per condition, what real participants did, with 95% bootstrap intervals.

Only completed participants count (a withdrawn one left no data). Per condition: the donation rate
(share who gave more than $0), the mean confirmed donation in dollars, each Likert question's mean,
and the conversation length in participant messages; a plot of the first two; markdown and a
self-contained HTML page, in the same style as ``scope report``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from scope_marl.config.study import StudyConfig
from scope_marl.core import files
from scope_marl.evaluation.report import pyplot, write_html
from scope_marl.evaluation.stats import format_interval, mean_with_ci
from scope_marl.study.store import Store


def summarize(records: Sequence[dict], conditions: Sequence[str], likert: Sequence[str], seed: int = 0) -> dict[str, dict]:
    """Per condition: n and an interval dict per measure (``donation_rate``, ``donation``, ``turns``, ``q_ID``)."""
    out = {}
    for condition in conditions:
        rows = [r for r in records if r["condition"] == condition and r["completed"]]
        donations = [float(r["donation"] or 0.0) for r in rows]
        row = {
            "n": len(rows),
            "donation_rate": mean_with_ci([1.0 if d > 0 else 0.0 for d in donations], seed=seed),
            "donation": mean_with_ci(donations, seed=seed),
            "turns": mean_with_ci([r["participant_turns"] for r in rows], seed=seed),
        }
        for q in likert:
            row[f"q_{q}"] = mean_with_ci([float(r["answers"][q]) for r in rows if q in r["answers"]], seed=seed)
        out[condition] = row
    return out


def plot(summary: dict[str, dict], path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (key, label) in zip(axes, [("donation_rate", "donation rate (share > $0)"), ("donation", "mean donation ($)")]):
        names = list(summary)
        cells = [summary[n][key] for n in names]
        means = [c["mean"] if c["mean"] is not None else math.nan for c in cells]
        errors = [
            [m - c["low"] if c["mean"] is not None else 0 for m, c in zip(means, cells)],
            [c["high"] - m if c["mean"] is not None else 0 for m, c in zip(means, cells)],
        ]
        bars = ax.bar(names, means, yerr=errors, capsize=4, color="#4c72b0")
        ax.bar_label(bars, fmt="%.2f", padding=2, fontsize=8)
        ax.set(title=label, ylim=(0, max(ax.get_ylim()[1], 0.1)))
        ax.tick_params(axis="x", rotation=20)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Human study, per condition (95% bootstrap intervals)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def markdown(summary: dict[str, dict], config: StudyConfig) -> str:
    likert = [q for q in config.survey if q.kind == "likert"]
    lines = [
        f"# {config.title}: results",
        "",
        "Completed participants only; every interval is a 95% percentile bootstrap over participants.",
        "",
        "![donation per condition](study.png)",
        "",
        "| condition | n | donation rate | mean donation ($) | participant messages | "
        + " | ".join(f"{q.id} (1-{q.scale})" for q in likert)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(likert),
    ]
    for name, row in summary.items():
        cells = [format_interval(row["donation_rate"]), format_interval(row["donation"]), format_interval(row["turns"])]
        cells += [format_interval(row[f"q_{q.id}"]) for q in likert]
        lines.append(f"| {name} | {row['n']} | " + " | ".join(cells) + " |")
    lines += ["", "Questions:", "", *[f"- `{q.id}`: {q.text}" for q in likert]]
    return "\n".join(lines) + "\n"


def write_report(db: str | Path, config: StudyConfig, out: str | Path) -> Path:
    """report.md, report.html and study.png in ``out``, from the study database ``db``."""
    if not Path(db).is_file():
        raise FileNotFoundError(f"no study database at {db}; pass the file scope study serve --db wrote")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    store = Store(db)
    try:
        records = store.records(include_incomplete=False)
    finally:
        store.close()
    summary = summarize(records, [c.name for c in config.conditions], [q.id for q in config.survey if q.kind == "likert"], config.seed)
    plot(summary, out / "study.png")
    files.write_json(out / "summary.json", summary)
    path = files.write_text(out / "report.md", markdown(summary, config))
    write_html(path, f"{config.title}: results")
    return path
