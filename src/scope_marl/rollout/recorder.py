"""Writes rollouts to disk: one JSONL file per rollout batch (Episode JSON, see docs/formats.md)
and a ``summary.json`` with counts, rewards and throughput. ``pandas.read_json(path, lines=True)``
reads a batch file directly."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from statistics import fmean, pstdev

from scope_marl.types import Episode, EpisodeStatus


class RolloutRecorder:
    def __init__(self, out_dir: str | os.PathLike):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.batches = len(list(self.out_dir.glob("episodes-*.jsonl")))  # continue numbering, never overwrite

    def write_batch(self, episodes: Sequence[Episode]) -> Path:
        path = self.out_dir / f"episodes-{self.batches:05d}.jsonl"
        tmp = path.with_suffix(".jsonl.tmp")
        with tmp.open("w") as f:
            for episode in episodes:
                f.write(episode.model_dump_json() + "\n")
        tmp.replace(path)  # a reader never sees half a batch
        self.batches += 1
        return path

    def write_summary(self, summary: dict) -> Path:
        path = self.out_dir / "summary.json"
        path.write_text(json.dumps(summary, indent=2) + "\n")
        return path


def read_episodes(path: str | os.PathLike) -> list[Episode]:
    with open(path) as f:
        return [Episode.model_validate_json(line) for line in f if line.strip()]


def summarize(episodes: Sequence[Episode], seconds: float, generated_tokens: int) -> dict:
    """Counts by status, per-role rewards of COMPLETED episodes, group integrity and throughput."""
    status = Counter(e.status.value for e in episodes)
    completed = [e for e in episodes if e.status == EpisodeStatus.COMPLETED]
    roles = sorted({r for e in completed for r in e.rewards})
    rewards = {}
    for role in roles:
        values = [e.rewards[role] for e in completed if role in e.rewards]
        rewards[role] = {"mean": fmean(values), "std": pstdev(values), "n": len(values)}
    groups: dict[str, set[str]] = {}
    for e in episodes:
        groups.setdefault(e.group_id, set()).add(e.simulator_id)
    from scope_marl.simulators.verbalized import vs_metrics

    return {
        **({"verbalized_sampling": m} if (m := vs_metrics(episodes)) else {}),
        "episodes": len(episodes),
        "status": {s.value: status.get(s.value, 0) for s in EpisodeStatus},
        "rewards": rewards,
        "groups": len(groups),
        "groups_with_one_simulator": sum(len(s) == 1 for s in groups.values()),
        "mean_messages": fmean(len(e.messages) for e in episodes) if episodes else 0.0,
        "generated_tokens": generated_tokens,
        "seconds": round(seconds, 3),
        "episodes_per_s": len(episodes) / seconds if seconds else 0.0,
        "tokens_per_s": generated_tokens / seconds if seconds else 0.0,
    }
