"""tau2-bench's domains on the project's protocol (an optional extra: see package.py)."""

from scope_marl.envs.tau2.env import STOP_TOKENS, Tau2, validation_size

__all__ = ["STOP_TOKENS", "Tau2", "validation_size"]
