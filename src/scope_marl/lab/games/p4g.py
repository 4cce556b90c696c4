"""The ``p4g`` game, estimated from the 300 annotated Persuasion for Good dialogues.

Everything comes from ``p4g_lab.json`` beside this module, written by ``scripts/fit_lab_p4g.py``
from the corpus (which is never copied here): nine persuader strategy groups, seven persuadee act
groups, two persona groups from the survey (moral-foundation "care"), the smoothed reply model
p(act | persona group, previous act, strategy) and the outcome model (stated donation from the acts
said). Ten turns, no act ends a dialogue early. docs/lab.md lists every modelling choice and the
cross-validation figures that back them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from scope_marl.lab.games.game import Game, Outcome

FITTED = Path(__file__).with_name("p4g_lab.json")


def p4g_game(path: str | Path = FITTED) -> Game:
    fit = json.loads(Path(path).read_text(encoding="utf-8"))
    acts = tuple(fit["acts"])
    reply = torch.tensor(fit["reply"]["table"], dtype=torch.float)
    reply = reply / reply.sum(-1, keepdim=True)  # undo the JSON's rounding
    weights = torch.tensor(fit["personas"]["weights"], dtype=torch.float)
    outcome = fit["outcome"]
    return Game(
        name="p4g",
        strategies=tuple(fit["strategies"]),
        acts=acts,
        personas=tuple(fit["personas"]["names"]),
        weights=weights / weights.sum(),
        reply=reply,
        turns=int(fit["turns"]),
        terminal=torch.zeros(len(acts), dtype=torch.bool),
        outcome=Outcome(
            intercept=float(outcome["intercept"]),
            any_act=torch.tensor([outcome["any_act"][a] for a in acts]),
            last_act=torch.zeros(len(acts)),
        ),
        vs_k=5,  # the paper's k; seven acts leave a listing of five a real choice
        notes={
            "source": fit["source"],
            "personas": fit["personas"]["rule"],
            "reply_model": fit["reply"]["model"],
            "beta": fit["reply"]["beta"],
            "outcome": outcome["model"],
            "outcome_target": outcome["target"],
            "outcome_cv_r2": outcome["cv_r2"][str(outcome["ridge_lambda"])],
            "reply_cv_ablation": fit["reply"]["cv_ablation_log_likelihood_per_turn"],
        },
    )
