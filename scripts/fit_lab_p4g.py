"""Fit the collapse lab's ``p4g`` game from the 300 annotated Persuasion for Good dialogues.

Writes src/scope_marl/lab/games/p4g_lab.json: label groupings, persona groups, a smoothed reply model
p(persuadee act | persona group, previous act, persuader strategy), an outcome model (reward from
the acts), and the cross-validation figures behind every fitted choice. No text and no per-dialogue
record is stored: only probabilities, weights and aggregate counts. docs/lab.md explains each choice.

Inputs (read from ../shared/data/p4g or --data-dir; never copied): 300_dialog.csv (per-sentence
strategy / act labels), 300_info.csv (B5 intended donation stated in the dialogue), full_info.csv
(the persuadee's survey).

Run: python scripts/fit_lab_p4g.py [--data-dir DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
from collections import Counter, defaultdict
from pathlib import Path

from scope_marl.envs.p4g.corpus import find_corpus_dir, read_participants

OUT = Path(__file__).resolve().parents[1] / "src" / "scope_marl" / "lab" / "games" / "p4g_lab.json"

# ---- label groups ----------------------------------------------------------------------------
# A turn carries several sentence labels; the turn's strategy (act) is the first group, in this
# priority order, that any of its labels belongs to: the label most likely to move the decision
# wins over small talk said in the same turn. Unlisted labels fall into the last group.
STRATEGIES = {
    "propose": ["proposition-of-donation", "ask-donation-amount", "ask-donate-more", "confirm-donation"],
    "foot-in-the-door": ["foot-in-the-door"],
    "emotion": ["emotion-appeal"],
    "logic": ["logical-appeal"],
    "credibility": ["credibility-appeal"],
    "story": ["personal-story", "self-modeling"],
    "information": ["donation-information"],
    "inquiry": ["personal-related-inquiry", "source-related-inquiry", "task-related-inquiry", "ask-not-donate-reason"],
    "small-talk": [],  # greeting, thank, acknowledgement, praise-user, off-task, other, closing, answers ...
}
ACTS = {
    "agree": ["agree-donation", "provide-donation-amount", "confirm-donation"],
    "disagree": ["disagree-donation", "disagree-donation-more"],
    "negative": ["negative-reaction-to-donation"],
    "positive": ["positive-reaction-to-donation"],
    "ask": [
        "ask-org-info",
        "ask-donation-procedure",
        "ask-persuader-donation-intention",
        "task-related-inquiry",
        "personal-related-inquiry",
    ],
    "neutral": ["neutral-reaction-to-donation"],
    "other": [],  # greeting, thank, acknowledgement, off-task, closing, answers to inquiries ...
}
# ---- persona groups ----------------------------------------------------------------------------
# The moral-foundation "care" score (1-6) is the survey trait most correlated with the actual
# donation over all 1,017 persuadees (r = +0.12, computed by this script); two groups keep every
# (group, previous act, strategy) cell of 300 dialogues populated enough to smooth.
CARE_CUT = 4.5
PERSONAS = ("high-care", "lower-care")
TURNS = 10  # modal length of the annotated dialogues (200 of 300 have 10 turns)
BETAS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)
LAMBDAS = (0.1, 1.0, 3.0, 10.0, 30.0, 100.0)
FOLDS = 5


def group_of(labels: set[str], groups: dict[str, list[str]]) -> str:
    for name, members in groups.items():
        if labels & set(members):
            return name
    return list(groups)[-1]


def number(text: str | None) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def read_turns(path: Path) -> dict[str, list[tuple[str, str | None]]]:
    """Dialogue id -> [(strategy, act or None)] per turn (None: the persuadee did not answer)."""
    turns: dict[str, dict[int, dict]] = defaultdict(dict)
    with path.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            turn = turns[row["B2"]].setdefault(int(row["Turn"]), {"persuader": set(), "persuadee": set(), "answered": False})
            if row["B4"] == "0":
                turn["persuader"].update(x for x in (row["er_label_1"], row["er_label_2"]) if x)
            else:
                turn["persuadee"].update(x for x in (row["ee_label_1"], row["ee_label_2"]) if x)
                turn["answered"] = True
    return {
        d: [
            (group_of(t["persuader"], STRATEGIES), group_of(t["persuadee"], ACTS) if t["answered"] else None)
            for _, t in sorted(by_turn.items())
        ]
        for d, by_turn in turns.items()
    }


# ---- reply model ---------------------------------------------------------------------------------


def transitions(dialogues: dict, persona: dict) -> list[tuple[int, int, int, int]]:
    """(persona, previous act, strategy, act) for every answered turn; previous = U before the first."""
    S, A = list(STRATEGIES), list(ACTS)
    out = []
    for d, turns in dialogues.items():
        previous = len(A)
        for strategy, act in turns:
            if act is None:
                continue
            out.append((persona[d], previous, S.index(strategy), A.index(act)))
            previous = A.index(act)
    return out


def fit_reply(data: list[tuple[int, int, int, int]], beta: float) -> list:
    """Interpolated back-off: p(a) -> p(a|s) -> p(a|s,g) -> p(a|g,prev,s), each with prior weight beta."""
    P, U, S = len(PERSONAS), len(ACTS), len(STRATEGIES)
    n_a, n_sa, n_gsa, n_gpsa = Counter(), Counter(), Counter(), Counter()
    for g, p, s, a in data:
        n_a[a] += 1
        n_sa[s, a] += 1
        n_gsa[g, s, a] += 1
        n_gpsa[g, p, s, a] += 1

    def level(counts, key, prior):
        total = sum(counts[(*key, a)] for a in range(U))
        return [(counts[(*key, a)] + beta * prior[a]) / (total + beta) for a in range(U)]

    p0 = [(n_a[a] + 1) / (len(data) + U) for a in range(U)]  # add-one: every act stays possible
    p1 = {s: level(n_sa, (s,), p0) for s in range(S)}
    p2 = {(g, s): level(n_gsa, (g, s), p1[s]) for g in range(P) for s in range(S)}
    return [[[level(n_gpsa, (g, p, s), p2[g, s]) for s in range(S)] for p in range(U + 1)] for g in range(P)]


def log_likelihood(table, data) -> float:
    return sum(math.log(table[g][p][s][a]) for g, p, s, a in data) / max(len(data), 1)


def folds_of(ids: list[str]) -> list[set[str]]:
    ids = sorted(ids)
    random.Random(0).shuffle(ids)
    return [set(ids[i::FOLDS]) for i in range(FOLDS)]


def cross_validate_reply(dialogues, persona, beta, drop: str | None = None) -> float:
    """Mean held-out log-likelihood per turn over dialogue folds; ``drop`` blanks a conditioning variable."""
    total = 0.0
    for fold in folds_of(list(dialogues)):

        def data(keep):
            rows = transitions({d: t for d, t in dialogues.items() if keep(d)}, persona)
            if drop == "persona":
                rows = [(0, p, s, a) for _, p, s, a in rows]
            if drop == "previous":
                rows = [(g, len(ACTS), s, a) for g, _, s, a in rows]
            return rows

        table = fit_reply(data(lambda d, fold=fold: d not in fold), beta)
        total += log_likelihood(table, data(lambda d, fold=fold: d in fold)) / FOLDS
    return total


# ---- outcome model -------------------------------------------------------------------------------


def features(turns) -> list[float]:
    """Which acts the persuadee said at least once (transfers between dialogue lengths)."""
    said = {act for _, act in turns if act is not None}
    return [1.0 if a in said else 0.0 for a in ACTS]


def frequencies(turns) -> list[float]:
    """The alternative we compared against: each act's share of the persuadee's turns."""
    said = [act for _, act in turns if act is not None]
    return [said.count(a) / max(len(said), 1) for a in ACTS]


def ridge(X: list[list[float]], y: list[float], lam: float) -> tuple[float, list[float]]:
    """Least squares with an L2 penalty on the weights, not the intercept (centred data)."""
    import numpy as np

    X, y = np.asarray(X), np.asarray(y)
    mx, my = X.mean(0), y.mean()
    Xc = X - mx
    w = np.linalg.solve(Xc.T @ Xc + lam * np.eye(X.shape[1]), Xc.T @ (y - my))
    return float(my - mx @ w), [float(v) for v in w]


def predict(intercept, weights, x) -> float:
    return min(1.0, max(0.0, intercept + sum(w * v for w, v in zip(weights, x))))


def cross_validate_outcome(ids, X, y, lam) -> float:
    """Held-out R^2 of the clamped prediction over dialogue folds."""
    index = {d: i for i, d in enumerate(ids)}
    sse = sst = 0.0
    for fold in folds_of(ids):
        train = [index[d] for d in ids if d not in fold]
        test = [index[d] for d in ids if d in fold]
        b, w = ridge([X[i] for i in train], [y[i] for i in train], lam)
        mean = sum(y[i] for i in train) / len(train)
        sse += sum((predict(b, w, X[i]) - y[i]) ** 2 for i in test)
        sst += sum((y[i] - mean) ** 2 for i in test)
    return 1.0 - sse / sst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None, help="folder with the P4G CSV files (default: ../shared/data/p4g)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    corpus = find_corpus_dir(args.data_dir)

    dialogues = read_turns(corpus / "300_dialog.csv")
    participants = read_participants(corpus)
    persuadees = {d: roles["user"] for d, roles in participants.items() if "user" in roles}

    # Persona groups (survey). Missing care scores (2 dialogues) join the larger group.
    care = {d: persuadees[d].survey.get("care") for d in dialogues}
    high = sum(1 for c in care.values() if isinstance(c, float) and c >= CARE_CUT)
    modal = 0 if high >= len(dialogues) - high else 1
    persona = {d: (0 if c >= CARE_CUT else 1) if isinstance(c, float) else modal for d, c in care.items()}
    sizes = Counter(persona.values())

    everyone = [p for p in persuadees.values() if isinstance(p.survey.get("care"), float)]
    don = [min(max(p.donation or 0.0, 0.0), 2.0) for p in everyone]
    cares = [p.survey["care"] for p in everyone]
    mc, md = sum(cares) / len(cares), sum(don) / len(don)
    corr = sum((c - mc) * (x - md) for c, x in zip(cares, don)) / math.sqrt(
        sum((c - mc) ** 2 for c in cares) * sum((x - md) ** 2 for x in don)
    )

    # Reply model: smoothing strength by cross-validated log-likelihood.
    cv = {beta: cross_validate_reply(dialogues, persona, beta) for beta in BETAS}
    beta = max(cv, key=cv.get)
    ablation = {
        "full": cv[beta],
        "without_persona": cross_validate_reply(dialogues, persona, beta, "persona"),
        "without_previous_act": cross_validate_reply(dialogues, persona, beta, "previous"),
    }
    data = transitions(dialogues, persona)
    table = fit_reply(data, beta)

    # Outcome model: the donation stated in the dialogue (B5, what the LLM path's reward reads),
    # clamped to the $2 payment and scaled to [0, 1]; no stated amount -> 0, as the LLM reward.
    stated, actual = {}, {}
    with (corpus / "300_info.csv").open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["B4"] == "1":
                amount = number(row["B5"])
                stated[row["B2"]] = min(max(amount, 0.0), 2.0) / 2.0 if amount is not None else 0.0
                actual[row["B2"]] = min(max(number(row["B6"]) or 0.0, 0.0), 2.0) / 2.0
    ids = sorted(d for d in dialogues if d in stated)
    X = [features(dialogues[d]) for d in ids]
    y = [stated[d] for d in ids]
    r2 = {lam: cross_validate_outcome(ids, X, y, lam) for lam in LAMBDAS}
    lam = max(r2, key=r2.get)
    intercept, weights = ridge(X, y, lam)
    r2_actual = max(cross_validate_outcome(ids, X, [actual[d] for d in ids], la) for la in LAMBDAS)
    r2_frequencies = max(cross_validate_outcome(ids, [frequencies(dialogues[d]) for d in ids], y, la) for la in LAMBDAS)

    def rnd(v: float) -> float:
        return round(v, 5)

    out = {
        "source": "Persuasion for Good, 300 annotated dialogues (Wang et al. 2019, Apache-2.0); fitted by scripts/fit_lab_p4g.py",
        "dialogues": len(dialogues),
        "answered_turns": len(data),
        "turns": TURNS,
        "strategies": {name: labels or ["(every other persuader label)"] for name, labels in STRATEGIES.items()},
        "acts": {name: labels or ["(every other persuadee label)"] for name, labels in ACTS.items()},
        "label_priority": "a turn's strategy (act) is the first group above that any of its sentence labels belongs to",
        "personas": {
            "names": list(PERSONAS),
            "rule": f"moral-foundation care score of the persuadee >= {CARE_CUT} -> high-care, else lower-care; "
            "missing score -> the larger group",
            "dialogues": [sizes[0], sizes[1]],
            "weights": [rnd(sizes[0] / len(dialogues)), rnd(sizes[1] / len(dialogues))],
            "care_donation_correlation_all_persuadees": rnd(corr),
        },
        "reply": {
            "model": "p(act | persona, previous act, strategy), interpolated back-off p(a) -> p(a|s) -> p(a|s,g) -> "
            "p(a|g,prev,s), each level (n(a) + beta * parent(a)) / (n + beta); p(a) add-one",
            "beta": beta,
            "cv_log_likelihood_per_turn": {str(b): rnd(v) for b, v in cv.items()},
            "cv_ablation_log_likelihood_per_turn": {k: rnd(v) for k, v in ablation.items()},
            "counts_by_strategy": {s: sum(1 for _, _, si, _ in data if si == i) for i, s in enumerate(STRATEGIES)},
            "table": [[[[rnd(p) for p in dist] for dist in prev] for prev in g] for g in table],
        },
        "outcome": {
            "model": "reward = clamp(intercept + sum_a any_act[a] * [act a said at least once], 0, 1)",
            "target": "stated donation B5 clamped to [0, 2] / 2 (no stated amount -> 0)",
            "ridge_lambda": lam,
            "cv_r2": {str(k): rnd(v) for k, v in r2.items()},
            "cv_r2_if_target_were_actual_donation": rnd(r2_actual),
            "cv_r2_if_features_were_act_frequencies": rnd(r2_frequencies),
            "intercept": rnd(intercept),
            "any_act": {a: rnd(w) for a, w in zip(ACTS, weights)},
            "mean_target": rnd(sum(y) / len(y)),
        },
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(
        f"wrote {args.out} ({args.out.stat().st_size} bytes): beta={beta} (cv ll {cv[beta]:.4f}), "
        f"ablation {ablation}, outcome lambda={lam} cv R2={r2[lam]:.3f} (actual-donation target: {r2_actual:.3f}), "
        f"groups {dict(sizes)}, care-donation r={corr:+.3f}"
    )


if __name__ == "__main__":
    main()
