"""Persona text from the P4G survey, in words a model can act on.

Scores become graded phrases ("very agreeable", "rarely anxious") rather than numbers: a 135M model
cannot act on "agreeable=3.2". Missing survey cells are left out, never printed as "nan".
Scales (from the corpus): Big-Five and decision style 1-5, moral foundations and Schwartz values 1-6.

Without the corpus, :class:`PersonaSampler` draws surveys trait by trait from the marginals in
``persona_marginals.json`` (derived from the corpus by ``scripts/fit_p4g_marginals.py``). Traits are
drawn independently: the sampler keeps each trait's distribution, not correlations between traits.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

MARGINALS_FILE = Path(__file__).with_name("persona_marginals.json")

# Big-Five on a 1-5 scale: one phrase per level, lowest to highest.
BIG_FIVE = {
    "extrovert": ["very reserved", "somewhat reserved", "neither outgoing nor reserved", "fairly outgoing", "very outgoing and talkative"],
    "agreeable": [
        "quite critical of others",
        "somewhat critical of others",
        "moderately agreeable",
        "fairly agreeable",
        "very agreeable and trusting",
    ],
    "conscientious": [
        "disorganized",
        "somewhat careless",
        "moderately organized",
        "fairly organized and dependable",
        "very organized and dependable",
    ],
    "neurotic": [
        "rarely anxious, emotionally calm",
        "not very anxious",
        "sometimes anxious",
        "often anxious",
        "very often anxious or moody",
    ],
    "open": [
        "conventional, not curious",
        "not very curious",
        "moderately open to new ideas",
        "fairly open to new ideas",
        "very curious and open to new ideas",
    ],
}
MORAL_FOUNDATIONS = {
    "care": "caring for people who suffer",
    "fairness": "fairness and justice",
    "loyalty": "loyalty to your group",
    "authority": "respect for authority and tradition",
    "purity": "purity and decency",
}
SCHWARTZ_VALUES = {
    "freedom": "personal freedom",
    "conform": "following rules",
    "tradition": "tradition",
    "benevolence": "helping people close to you",
    "universalism": "the welfare of all people",
    "self_direction": "independence",
    "stimulation": "excitement and novelty",
    "hedonism": "enjoying life",
    "achievement": "personal success",
    "power": "wealth and status",
    "security": "safety and stability",
}
NUMERIC = [*BIG_FIVE, *MORAL_FOUNDATIONS, *SCHWARTZ_VALUES, "rational", "intuitive", "age", "income"]
CATEGORICAL = ["sex", "race", "edu", "marital", "employment", "religion", "ideology"]


def _level(score: float, low: float, high: float) -> int:
    """Which fifth of the scale [low, high] a score falls in (0..4)."""
    return min(4, max(0, int((score - low) / (high - low) * 5)))


def _demographics(s: dict) -> str:
    parts = []
    age = s.get("age")
    if isinstance(age, (int, float)) and 18 <= age <= 100:  # the survey has a few impossible ages
        parts.append(f"{int(age)} years old")
    sex = s.get("sex")
    if sex in ("Male", "Female"):
        parts.append("a man" if sex == "Male" else "a woman")
    if s.get("race") == "White":
        parts.append("white")
    edu = {
        "Less than four-year college": "without a four-year college degree",
        "Four-year college": "with a four-year college degree",
        "Postgraduate": "with a postgraduate degree",
    }.get(s.get("edu"))
    if edu:
        parts.append(edu)
    marital = {"Married": "married", "Unmarried": "not married"}.get(s.get("marital"))
    if marital:
        parts.append(marital)
    if s.get("employment") == "Employed for wages":
        parts.append("employed for wages")
    income = s.get("income")
    if isinstance(income, (int, float)):
        parts.append("with a lower income" if income <= 4 else "with a middle income" if income <= 8 else "with a higher income")
    religion = {"Protestant": "Protestant", "Catholic": "Catholic", "Atheist": "an atheist"}.get(s.get("religion"))
    if religion:
        parts.append(religion)
    ideology = s.get("ideology")
    if isinstance(ideology, str) and ideology in ("Liberal", "Conservative", "Moderate"):
        parts.append(f"politically {ideology.lower()}")
    return ", ".join(parts)


def persona_text(survey: dict) -> str:
    """A short second-person persona built from one participant's survey answers."""
    sentences = []
    who = _demographics(survey)
    if who:
        sentences.append(f"You are {who}.")
    traits = [phrases[_level(survey[t], 1, 5)] for t, phrases in BIG_FIVE.items() if isinstance(survey.get(t), (int, float))]
    if traits:
        sentences.append("Personality: " + "; ".join(traits) + ".")
    values = sorted(
        ((survey[k], phrase) for k, phrase in {**MORAL_FOUNDATIONS, **SCHWARTZ_VALUES}.items() if isinstance(survey.get(k), (int, float))),
        key=lambda item: -item[0],
    )
    if values:
        top = [phrase for score, phrase in values[:3] if score >= 4.0]
        bottom = [phrase for score, phrase in values[-2:] if score <= 3.0 and phrase not in top]
        if top:
            sentences.append("You care most about " + ", ".join(top) + ".")
        if bottom:
            sentences.append("You care little about " + " or ".join(bottom) + ".")
    rational, intuitive = survey.get("rational"), survey.get("intuitive")
    if isinstance(rational, (int, float)) and isinstance(intuitive, (int, float)) and abs(rational - intuitive) >= 0.5:
        sentences.append("You decide by careful reasoning." if rational > intuitive else "You decide by gut feeling.")
    return " ".join(sentences) if sentences else "You are an ordinary adult."


class PersonaSampler:
    """Draws synthetic surveys trait by trait from the corpus marginals (no corpus needed)."""

    def __init__(self, marginals: dict | None = None):
        self.marginals = marginals if marginals is not None else json.loads(MARGINALS_FILE.read_text())

    def sample(self, role: str, rng: random.Random) -> dict:
        survey: dict = {}
        for trait, dist in self.marginals["roles"][role].items():
            value = rng.choices(dist["values"], weights=dist["weights"])[0]
            if value is not None:
                survey[trait] = value
        return survey

    def donation_rate(self) -> float:
        return self.marginals["persuadee_donation_rate"]
