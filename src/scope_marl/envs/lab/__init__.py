"""The collapse lab: simulator collapse, Verbalized Sampling and co-training in seconds on a CPU.

Two small games (``theory``: the paper's formal setting; ``p4g``: estimated from the annotated
Persuasion for Good dialogues) played by a tabular strategy policy against discrete-act user
simulators that reuse the LLM path's simulator classes and GRPO losses. ``scope lab`` runs it;
docs/lab.md explains every modelling choice.
"""

from scope_marl.envs.lab.game import Game, Outcome
from scope_marl.envs.lab.runner import ARMS, GAMES, format_table, load_game, run_lab

__all__ = ["ARMS", "GAMES", "Game", "Outcome", "format_table", "load_game", "run_lab"]
