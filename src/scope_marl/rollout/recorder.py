"""Writes rollouts to disk: one JSONL file per rollout batch (Episode JSON, see docs/formats.md)
and a ``summary.json`` with counts, rewards and throughput. ``pandas.read_json(path, lines=True)``
reads a batch file directly."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from statistics import fmean, pstdev

from scope_marl.core import files
from scope_marl.core.types import Episode, EpisodeStatus
from scope_marl.simulators.base import Simulator

BATCH_GLOB = "episodes-*.jsonl"


class RolloutRecorder:
    """Numbered batch files ``episodes-NNNNN.jsonl`` in ``out_dir``, numbered on after those already there."""

    def __init__(self, out_dir: str | os.PathLike):
        self.out_dir = Path(out_dir)
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise NotADirectoryError(f"{self.out_dir} is a file; the output must be a folder (existing batches in it are kept)")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        # Continue after the highest number there (not the count: a deleted batch must not make the next
        # one overwrite a later one).
        self.batches = max((self.batch_number(p) + 1 for p in self.out_dir.glob(BATCH_GLOB)), default=0)

    @staticmethod
    def batch_number(path: Path) -> int:
        return int(path.stem.split("-")[1])

    @classmethod
    def remove_batches_from(cls, out_dir: str | os.PathLike, first: int) -> int:
        """Delete the batches numbered ``first`` and later (a resumed run plays them again); how many went."""
        later = [p for p in Path(out_dir).glob(BATCH_GLOB) if cls.batch_number(p) >= first]
        for path in later:
            path.unlink()
        return len(later)

    def write_batch(self, episodes: Sequence[Episode]) -> Path:
        path = self.out_dir / f"episodes-{self.batches:05d}.jsonl"
        lines = [serialize(episode) for episode in episodes]  # before the file opens: one bad episode fails alone
        with files.atomic_file(path) as f:  # a crash leaves the old file or the whole new one
            f.writelines(lines)
        self.batches += 1
        return path

    def write_summary(self, summary: dict) -> Path:
        return files.write_json(self.out_dir / "summary.json", summary)


def serialize(episode: Episode) -> str:
    """One JSONL line. An episode that cannot be written becomes a FAILED record of its ids and the
    reason (in memory too, so training leaves it out), instead of taking its whole batch down."""
    try:
        return episode.model_dump_json() + "\n"
    except Exception as err:  # e.g. a value pydantic cannot serialize, from a simulator's metadata
        episode.status = EpisodeStatus.FAILED
        episode.error = f"the episode could not be written ({type(err).__name__}: {err})"
        stub = Episode(
            episode_id=episode.episode_id,
            task_id=episode.task_id,
            group_id=episode.group_id,
            simulator_id=episode.simulator_id,
            split=episode.split,
            status=EpisodeStatus.FAILED,
            error=episode.error,
        )
        return stub.model_dump_json() + "\n"


def read_episodes(path: str | os.PathLike) -> list[Episode]:
    with open(path) as f:
        return [Episode.model_validate_json(line) for line in f if line.strip()]


def tool_use(episodes: Sequence[Episode]) -> dict:
    """Per role: tool-call turns, calls that parsed, calls that did not, the parse rate, and failed
    calls (the environment answered with an error). Empty for environments without tools."""
    with_tools = [e for e in episodes if e.tool_errors is not None]
    if not with_tools:
        return {}
    out = {}
    for role in sorted({m.role for e in with_tools for m in e.messages if m.tool_calls is not None}):
        turns = [m for e in with_tools for m in e.messages if m.role == role and m.tool_calls is not None]
        results = [m for e in with_tools for m in e.messages if m.role == "tool" and m.requestor == role]
        ids = {c.id for m in turns for c in m.tool_calls}
        unparsed = sum(1 for r in results if r.tool_call_id not in ids)
        out[role] = {
            "call_turns": len(turns),
            "calls": len(ids),
            "unparsed": unparsed,
            "parse_rate": len(ids) / (len(ids) + unparsed) if ids or unparsed else None,
            "failed": sum(1 for r in results if r.error and r.tool_call_id in ids),
        }
    return {"tools": out, "tool_errors": sum(e.tool_errors for e in with_tools)}


def summarize(episodes: Sequence[Episode], seconds: float, generated_tokens: int, simulator: Simulator | None = None) -> dict:
    """Counts by status, per-role rewards of COMPLETED episodes, group integrity and throughput,
    plus what the ``simulator`` that played them reports through its ``batch_metrics`` hook."""
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
    return {
        **(simulator.batch_metrics(episodes) if simulator is not None else {}),
        **tool_use(episodes),
        "episodes": len(episodes),
        "status": {s.value: status.get(s.value, 0) for s in EpisodeStatus},
        "failure_reasons": dict(Counter(e.error for e in episodes if e.status == EpisodeStatus.FAILED)),
        "rewards": rewards,
        "groups": len(groups),
        "groups_with_one_simulator": sum(len(s) == 1 for s in groups.values()),
        "mean_messages": fmean(len(e.messages) for e in episodes) if episodes else 0.0,
        "generated_tokens": generated_tokens,
        "seconds": round(seconds, 3),
        "episodes_per_s": len(episodes) / seconds if seconds else 0.0,
        "tokens_per_s": generated_tokens / seconds if seconds else 0.0,
    }
