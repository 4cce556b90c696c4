"""Cooperative coding in CooperBench's layout, offline: tasks, a sandboxed scorer, the environment."""

from scope_marl.envs.coop.env import DONE, TOOLS, Coop
from scope_marl.envs.coop.sandbox import Limits, run_sandboxed
from scope_marl.envs.coop.scoring import PatchError, Score, Scorer
from scope_marl.envs.coop.tasks import CoopTask, TaskError, load_task, load_tasks

__all__ = [
    "DONE",
    "TOOLS",
    "Coop",
    "CoopTask",
    "Limits",
    "PatchError",
    "Score",
    "Scorer",
    "TaskError",
    "load_task",
    "load_tasks",
    "run_sandboxed",
]
