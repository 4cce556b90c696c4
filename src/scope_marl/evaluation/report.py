"""``scope report``: collapse at a glance, from run directories (and ``scope eval`` outputs).

Collapse shows as diverging lines: reward against the training simulator goes up while reward
against held-out simulators and the agent's policy entropy go down. :func:`plot_collapse` draws
those three panels, one line per run / arm (the collapse lab uses it too); :func:`plot_heldout_bars`
draws held-out reward per simulator with 95% intervals; :func:`write_report` adds ``report.md``
with the tables side by side, and :func:`write_html` the same report as one self-contained
``report.html`` (plots embedded), which opens from a file browser.
"""

from __future__ import annotations

import base64
import html
import json
import math
import mimetypes
from pathlib import Path

from scope_marl.core import files
from scope_marl.evaluation.stats import format_interval, format_number

PANELS = [
    ("train_reward", "Reward vs the training simulator", "mean agent reward"),
    ("heldout_reward", "Reward vs held-out simulators", "mean agent reward"),
    ("policy_entropy", "Agent policy entropy", "mean token entropy (nats)"),
]


def pyplot():
    """matplotlib's pyplot on the Agg backend: plots are files, no display needed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_collapse(
    series: dict[str, list[dict]], path: str | Path, title: str = "Simulator collapse", panels: list[tuple[str, str, str]] = PANELS
) -> Path:
    """One panel per ``(key, title, y label)`` of ``panels`` (default: three) over training steps, one line per arm.

    ``series[arm]`` is a list of points ``{"step", "train_reward", "heldout_reward",
    "policy_entropy"}`` (None where not measured that step), each optionally with ``<key>_low`` /
    ``<key>_high`` for a 95% band.
    """
    import matplotlib.ticker

    plt = pyplot()
    fig, axes = plt.subplots(
        1, len(panels), figsize=(5 * len(panels), 4.2), sharex=True
    )  # one step axis, even for a single evaluation point
    styles = ["-", "--", ":", "-."]  # arms with equal numbers still show as separate lines
    markers = ["o", "s", "^", "D", "v", "P"]
    for ax, (key, panel_title, ylabel) in zip(axes, panels):
        for i, (arm, points) in enumerate(series.items()):
            points = [p for p in points if p.get(key) is not None and math.isfinite(p[key])]
            if not points:
                continue
            steps = [p["step"] for p in points]
            (line,) = ax.plot(
                steps,
                [p[key] for p in points],
                linestyle=styles[i % len(styles)],
                marker=markers[i % len(markers)] if len(points) < 30 else None,
                markersize=5,
                label=arm,
            )
            if all(p.get(f"{key}_low") is not None for p in points):
                low, high = [p[f"{key}_low"] for p in points], [p[f"{key}_high"] for p in points]
                if len(points) > 1:
                    ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
                else:  # a band needs two points; one point gets an error bar
                    ax.errorbar(
                        steps,
                        [p[key] for p in points],
                        yerr=[[p[key] - lo for p, lo in zip(points, low)], [hi - p[key] for p, hi in zip(points, high)]],
                        color=line.get_color(),
                        capsize=4,
                        linestyle="none",
                    )
        if not ax.lines:
            ax.text(0.5, 0.5, "not measured in these runs", ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.set(title=panel_title, xlabel="training step", ylabel=ylabel)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.08 if handles else 0, 1, 1))
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---- reading runs --------------------------------------------------------------------------------


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def final_evaluation(run_dir: Path) -> dict | None:
    """The run's latest full evaluation: ``eval/eval.json`` (scope eval --out RUN_DIR/eval, or the
    demo), else the last periodic one in ``evals/``, else ``eval.json`` when the folder is a scope eval output."""
    for candidate in (
        run_dir / "eval" / "eval.json",
        *sorted((run_dir / "evals").glob("step-*.json"), reverse=True),
        run_dir / "eval.json",
    ):
        if candidate.exists():
            return json.loads(candidate.read_text())
    return None


def collapse_series(records: list[dict], final: dict | None = None) -> list[dict]:
    """Points for :func:`plot_collapse` from metrics lines: training-simulator reward, held-out reward
    (on evaluation steps, with its interval) and the policy entropy the learner measured. A separate
    evaluation of one checkpoint (``final``: ``scope eval`` into RUN_DIR/eval, or the demo's) adds its
    held-out point at the step that checkpoint was saved, where periodic evaluation left none."""
    points = []
    for r in records:
        held = (r.get("eval") or {}).get("heldout", {}).get("reward", {})
        points.append(
            {
                "step": r["step"],
                "train_reward": (r.get("reward_agent") or {}).get("mean"),
                "heldout_reward": held.get("mean"),
                "heldout_reward_low": held.get("low"),
                "heldout_reward_high": held.get("high"),
                "policy_entropy": (r.get("train_agent") or {}).get("entropy"),
            }
        )
    at = [p for p in points if final and p["step"] == final.get("step") and p["heldout_reward"] is None]
    if at:
        held = final["heldout"]["reward"]
        at[0].update(heldout_reward=held["mean"], heldout_reward_low=held["low"], heldout_reward_high=held["high"])
    return points


def load_runs(paths: list[Path]) -> dict[str, dict]:
    runs = {}
    for path in paths:
        records, evaluation = read_metrics(path), final_evaluation(path)
        if not records and evaluation is None:
            raise FileNotFoundError(f"{path} has neither metrics.jsonl (a scope train run) nor eval.json (a scope eval output)")
        name = path.name if path.name not in runs else str(path)
        # final_evaluation reads eval/eval.json first when it exists: that is the separate evaluation.
        final = evaluation if (path / "eval" / "eval.json").exists() else None
        runs[name] = {"path": str(path), "records": records, "evaluation": evaluation, "final": final}
    return runs


# ---- plots and tables ----------------------------------------------------------------------------


def plot_heldout_bars(runs: dict[str, dict], path: Path) -> Path | None:
    """Reward per panel simulator with 95% intervals, one bar per run; training simulators marked."""
    evaluated = {name: run["evaluation"] for name, run in runs.items() if run["evaluation"]}
    if not evaluated:
        return None
    plt = pyplot()
    simulators = list(dict.fromkeys(sid for ev in evaluated.values() for sid in ev["simulators"]))
    trained = {sid for ev in evaluated.values() for sid, r in ev["simulators"].items() if r["training"]}
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(simulators) * max(1, len(evaluated)) / 2 + 3), 4.5))
    width = 0.8 / len(evaluated)
    for i, (name, ev) in enumerate(evaluated.items()):
        cells = [ev["simulators"].get(sid, {}).get("reward", {}) for sid in simulators]
        means = [c.get("mean") if c.get("mean") is not None else math.nan for c in cells]
        errors = [
            [m - (c.get("low") if c.get("low") is not None else m) for m, c in zip(means, cells)],
            [(c.get("high") if c.get("high") is not None else m) - m for m, c in zip(means, cells)],
        ]
        bars = ax.bar([j + i * width for j in range(len(simulators))], means, width, yerr=errors, capsize=3, label=name)
        ax.bar_label(bars, fmt="%.2f", padding=2, fontsize=8)  # a zero bar is otherwise invisible
    labels = [f"{sid}\n(training)" if sid in trained else sid for sid in simulators]
    ax.set_xticks([j + width * (len(evaluated) - 1) / 2 for j in range(len(simulators))], labels, rotation=20, ha="right")
    ax.set(title="Agent reward per panel simulator (95% bootstrap intervals)", ylabel="mean agent reward")
    ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], 0.1))
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))  # outside the bars and their labels
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report_markdown(runs: dict[str, dict], title: str = "Report", level: int = 1, images: str = "") -> str:
    """The report's markdown: the plots, a table of runs and a table of reward per simulator.

    ``level`` is the depth of its top heading and ``images`` the folder of its plots relative to the
    markdown file, so a longer report (``scope demo``'s) can hold it as a section.
    """
    h = "#" * level
    lines = [
        f"{h} {title}",
        "",
        "Collapse reads as training-simulator reward rising while held-out reward and policy entropy fall.",
        "",
        f"![collapse curves]({images}collapse.png)",
        "",
        *([f"![reward per panel simulator]({images}heldout.png)", ""] if any(r["evaluation"] for r in runs.values()) else []),
        f"{h}# Runs",
        "",
        "| run | steps | train reward (first -> last) | held-out reward [95% CI] | held-out success | policy entropy | distinct-2 | coverage |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, run in runs.items():
        train = [p["train_reward"] for p in collapse_series(run["records"]) if p["train_reward"] is not None]
        held = (run["evaluation"] or {}).get("heldout", {})
        lines.append(
            f"| {name} | {len(run['records'])} | {format_number(train[0]) if train else '-'} -> {format_number(train[-1]) if train else '-'} | "
            f"{format_interval(held.get('reward'))} | {format_interval(held.get('success'))} | {format_number(held.get('policy_entropy'))} | "
            f"{format_number(held.get('diversity', {}).get('distinct_2'))} | {format_number(held.get('diversity', {}).get('coverage'))} |"
        )
    evaluated = {name: run["evaluation"] for name, run in runs.items() if run["evaluation"]}
    if evaluated:
        simulators = list(dict.fromkeys(sid for ev in evaluated.values() for sid in ev["simulators"]))
        lines += ["", f"{h}# Reward per simulator", "", "| simulator | " + " | ".join(evaluated) + " |", "|---|" + "---|" * len(evaluated)]
        for sid in simulators:
            mark = " (training)" if any(ev["simulators"].get(sid, {}).get("training") for ev in evaluated.values()) else ""
            lines.append(
                f"| {sid}{mark} | "
                + " | ".join(format_interval(ev["simulators"].get(sid, {}).get("reward")) for ev in evaluated.values())
                + " |"
            )
    return "\n".join(lines) + "\n"


def write_plots(runs: dict[str, dict], out: Path, title: str) -> None:
    """collapse.png (every run with metrics) and heldout.png (every run with an evaluation) in ``out``."""
    series = {name: collapse_series(run["records"], run["final"]) for name, run in runs.items() if run["records"]}
    plot_collapse(series, out / "collapse.png", title)
    plot_heldout_bars(runs, out / "heldout.png")


def write_report(run_dirs: list[str | Path], out: str | Path, title: str = "Simulator collapse") -> Path:
    """``scope report``: collapse.png, heldout.png, report.md and a self-contained report.html for one or more runs."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = load_runs([Path(p) for p in run_dirs])
    write_plots(runs, out, title)
    files.write_text(out / "report.md", report_markdown(runs))
    write_html(out / "report.md", title)
    return out / "report.md"


# ---- one self-contained HTML file ----------------------------------------------------------------

HTML_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 72rem; margin: 2rem auto; padding: 0 1rem; line-height: 1.45; color: #1b1b1b; }
table { border-collapse: collapse; margin: 0.8rem 0; font-size: 0.9rem; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.55rem; text-align: left; }
th { background: #f2f2f2; }
img { max-width: 100%; }
code, pre { background: #f5f5f5; border-radius: 3px; }
pre { padding: 0.6rem; overflow-x: auto; }
"""


def markdown_to_html(text: str, base: Path, title: str) -> str:
    """A standalone HTML page of ``text``: tables rendered, every image read from ``base`` and
    embedded as a data URI, so the page opens from a file browser with nothing beside it."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = md.parse(text)
    for token in tokens:
        for child in token.children or []:
            if child.type == "image":
                child.attrSet("src", data_uri(base / str(child.attrGet("src"))))
    body = md.renderer.render(tokens, md.options, {})
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
        f"<style>{HTML_STYLE}</style>\n</head>\n<body>\n{body}</body>\n</html>\n"
    )


def data_uri(path: Path) -> str:
    if not path.is_file():
        raise FileNotFoundError(f"the report shows {path}, which was not written; rerun the command that writes the report")
    kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return f"data:{kind};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def write_html(markdown_path: Path, title: str) -> Path:
    """``report.html`` beside ``markdown_path``: the same report, with its plots inside the file."""
    markdown_path = Path(markdown_path)
    target = markdown_path.with_suffix(".html")
    files.write_text(target, markdown_to_html(markdown_path.read_text(), markdown_path.parent, title))
    return target
