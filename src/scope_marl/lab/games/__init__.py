"""The lab's games: who the users are, how a human replies, and what a dialogue earns.

``theory`` is the paper's formal setting, defined by hand; ``p4g`` is estimated from the annotated
Persuasion for Good dialogues; ``exact`` computes expected rewards by dynamic programming.
"""

from scope_marl.lab.games.game import Game, Outcome

GAMES = ("theory", "p4g")


def load_game(name: str) -> Game:
    if name == "theory":
        from scope_marl.lab.games.theory import theory_game

        return theory_game()
    if name == "p4g":
        from scope_marl.lab.games.p4g import p4g_game

        return p4g_game()
    raise ValueError(f"unknown lab game {name!r}; use one of {list(GAMES)}")


__all__ = ["GAMES", "Game", "Outcome", "load_game"]
