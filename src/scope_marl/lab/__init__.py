"""The collapse lab: simulator collapse, Verbalized Sampling and co-training in seconds on a CPU.

Two small games (``theory``: the paper's formal setting; ``p4g``: estimated from the annotated
Persuasion for Good dialogues) played by a tabular strategy policy against discrete-act user
simulators that reuse the LLM path's simulator classes and GRPO losses. ``scope lab`` runs it;
docs/lab.md explains every modelling choice. By concern:

    games/       the games (game tables, theory, p4g, exact expected rewards)
    simulators   act simulators on the shared Simulator / Rotation / SimulatorPool classes
    policy       the tabular strategy policy;  episodes: batched dialogues
    panel        held-out / validation panels of act simulators (YAML)
    arms         what each arm trains against, and the settings per game
    loop         one arm, one seed: the GRPO updates and held-out evaluation
    run          every arm over seeds, summarized with t-intervals (``scope lab``)
    report       tables, checks and the collapse plot
    tune         hyperparameters chosen on the validation panel
"""

from scope_marl.lab.arms import ARMS
from scope_marl.lab.games import GAMES, Game, Outcome, load_game
from scope_marl.lab.report import format_table
from scope_marl.lab.run import run_lab

__all__ = ["ARMS", "GAMES", "Game", "Outcome", "format_table", "load_game", "run_lab"]
