"""The ``theory`` game: the paper's formal setting, small enough to read in one screen.

Three persona types share one world. The *warm* majority (55%) likes a direct ask more than any
other user does; two real minorities (*skeptic* 30%, *guarded* 15%) refuse a direct ask and respond
to emotion or evidence instead. Three strategies, four acts, three turns:

- ``agree`` ends the dialogue with a donation worth ``0.9 ** t`` (an agreement that takes more
  turns is worth less: attention and pledges shrink), ``refuse`` ends it with nothing;
- ``engage`` and ``question`` continue; a dialogue that runs out of turns on them is worth 0.25
  (the user leaves warm and gives a little) or 0.1 (still asking).

Why this shows simulator collapse. Against a human user (the population, gamma = 1) a direct ask
is a gamble that loses most minority users, and the best policy builds rapport first (emotion;
logic once a question was asked). A collapsed simulator ignores the persona it was given (plays
the warm majority) and is gamma-sharpened: ``p**4 / Z`` turns the warm user's 50/35 split
between agreeing and refusing a direct ask into about 80/20. Against it, asking at once is the
best policy by a clear margin, so single-simulator RL learns to ask at once: its reward against
the training simulator rises to ~0.8 while its reward against humans falls *below* the untrained
uniform policy's (the biased policy gradient of a collapsed simulator). These numbers were chosen
for that property (the design check is ``tests/test_lab.py::test_theory_game_has_the_collapse_property``,
exact dynamic programming, no training); they are never tuned on the held-out panel.
"""

from __future__ import annotations

import torch

from scope_marl.lab.games.game import Game, Outcome

STRATEGIES = ("emotion", "logic", "ask")
ACTS = ("agree", "engage", "question", "refuse")
PERSONAS = {"warm": 0.55, "skeptic": 0.30, "guarded": 0.15}
TURNS = 3

# p(agree, engage, question, refuse | persona, strategy) at the start and after "engage".
REPLY = {
    "warm": {"emotion": (0.30, 0.60, 0.05, 0.05), "logic": (0.20, 0.60, 0.15, 0.05), "ask": (0.50, 0.10, 0.05, 0.35)},
    "skeptic": {"emotion": (0.05, 0.25, 0.50, 0.20), "logic": (0.25, 0.35, 0.35, 0.05), "ask": (0.05, 0.05, 0.20, 0.70)},
    "guarded": {"emotion": (0.10, 0.60, 0.10, 0.20), "logic": (0.10, 0.60, 0.25, 0.05), "ask": (0.05, 0.05, 0.10, 0.80)},
}
# Where the previous act changes the reply: evidence answers a question; rapport softens an ask.
AFTER = {
    "skeptic": {"question": {"logic": (0.50, 0.25, 0.20, 0.05)}, "engage": {"ask": (0.35, 0.10, 0.15, 0.40)}},
    "guarded": {"question": {"logic": (0.30, 0.50, 0.15, 0.05)}, "engage": {"ask": (0.30, 0.20, 0.10, 0.40)}},
}
# Reward of the last act (agree: the donation; engage / question at the last turn: a little).
LAST_ACT = (1.0, 0.25, 0.10, 0.0)
DISCOUNT = 0.9


def reply_table() -> torch.Tensor:
    """[P, U + 1, S, U]: REPLY everywhere, overridden by AFTER where the previous act matters."""
    table = torch.zeros(len(PERSONAS), len(ACTS) + 1, len(STRATEGIES), len(ACTS))
    for p, persona in enumerate(PERSONAS):
        for s, strategy in enumerate(STRATEGIES):
            table[p, :, s] = torch.tensor(REPLY[persona][strategy])
            for previous, rows in AFTER.get(persona, {}).items():
                if strategy in rows:
                    table[p, ACTS.index(previous), s] = torch.tensor(rows[strategy])
    return table


def theory_game() -> Game:
    return Game(
        name="theory",
        strategies=STRATEGIES,
        acts=ACTS,
        personas=tuple(PERSONAS),
        weights=torch.tensor(list(PERSONAS.values())),
        reply=reply_table(),
        turns=TURNS,
        terminal=torch.tensor([a in ("agree", "refuse") for a in ACTS]),
        outcome=Outcome(intercept=0.0, any_act=torch.zeros(len(ACTS)), last_act=torch.tensor(LAST_ACT), discount=DISCOUNT),
        # Five *distinct* candidates over four acts would list every act and make VS-random a
        # uniform user; with k = U - 1 a listing is still a choice (see simulators.VerbalizedActs).
        vs_k=len(ACTS) - 1,
        notes={"source": "defined by hand in scope_marl/lab/games/theory.py (see its docstring)"},
    )
