"""Benchmark environments, one module (or folder) each."""

from scope_marl.envs.base import AGENT, USER, Environment, Task, role_view
from scope_marl.envs.say_the_word import SayTheWord

__all__ = ["AGENT", "USER", "Environment", "SayTheWord", "Task", "role_view"]
