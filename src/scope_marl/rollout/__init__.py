"""Playing episodes: the batched engine, per-role token streams, and the JSONL recorder."""

from scope_marl.rollout.engine import RolloutEngine
from scope_marl.rollout.recorder import RolloutRecorder, read_episodes, summarize

__all__ = ["RolloutEngine", "RolloutRecorder", "read_episodes", "summarize"]
