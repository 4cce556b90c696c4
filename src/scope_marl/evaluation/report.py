"""``scope report``: collapse at a glance, from run directories (and ``scope eval`` outputs).

Collapse shows as diverging lines: reward against the training simulator goes up while reward
against held-out simulators and the agent's policy entropy go down. :func:`plot_collapse` draws
those three panels, one line per run / arm (the collapse lab uses it too); :func:`plot_heldout_bars`
draws held-out reward per simulator with 95% intervals; :func:`write_report` adds ``report.md``
with the tables side by side.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

PANELS = [
    ("train_reward", "Reward vs the training simulator", "mean agent reward"),
    ("heldout_reward", "Reward vs held-out simulators", "mean agent reward"),
    ("policy_entropy", "Agent policy entropy", "mean token entropy (nats)"),
]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_collapse(series: dict[str, list[dict]], path: str | Path, title: str = "Simulator collapse") -> Path:
    """Three panels over training steps, one line per arm.

    ``series[arm]`` is a list of points ``{"step", "train_reward", "heldout_reward",
    "policy_entropy"}`` (None where not measured that step), each optionally with ``<key>_low`` /
    ``<key>_high`` for a 95% band.
    """
    import matplotlib.ticker

    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, (key, panel_title, ylabel) in zip(axes, PANELS):
        for arm, points in series.items():
            points = [p for p in points if p.get(key) is not None and math.isfinite(p[key])]
            if not points:
                continue
            steps = [p["step"] for p in points]
            line, = ax.plot(steps, [p[key] for p in points], marker="o" if len(points) < 30 else None, markersize=3, label=arm)
            if all(p.get(f"{key}_low") is not None for p in points):
                ax.fill_between(steps, [p[f"{key}_low"] for p in points], [p[f"{key}_high"] for p in points],
                                color=line.get_color(), alpha=0.15, linewidth=0)
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
