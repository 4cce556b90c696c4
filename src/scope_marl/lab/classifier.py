"""Which of a lab game's strategies an LLM agent's message plays: fixed keyword and pattern rules.

When the lab's agent is a language model, its message is free text but the lab's act simulators
answer a *strategy*. This classifier is the bridge: a fixed, documented rule, not a model, so that
what a message counts as never drifts during training and anyone can check a verdict by hand.

Rule: every strategy of a game has a list of case-insensitive regular expressions (word-bounded
keywords and short phrases). A message scores, per strategy, the number of distinct patterns it
matches; the strategy with the highest score wins, ties go to the strategy listed first in the
game's ``PATTERNS`` (the more specific strategies are listed first), and a message that matches
nothing is ``OTHER``. ``OTHER`` is not one of the game's strategies: the caller decides what an
unclassifiable message does, and reports how often it happened.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

OTHER = "other"

# theory: emotion (feelings, suffering, children, stories), logic (facts, numbers, evidence,
# efficiency), ask (a direct request to donate now).
THEORY = {
    "ask": [
        r"\b(would|will|could|can) you (please )?(donate|give|contribute|help|support|spare|chip in)",
        r"\byou (can|could|should) (donate|give|contribute|chip in)\b",
        r"(^|[.!?]\s+)(please )?(donate|give|contribute|chip in)\b",  # an imperative opening a sentence
        r"\bplease (donate|give|contribute)",
        r"\b(donate|give|contribute) (now|today|\$?\d+)",
        r"\bhow much (would|will|could|can) you",
        r"\b(make|consider making) a donation",
        r"\bwhy not (donate|give)",
        r"\bjoin (me|us) (in|and) (donating|giving)",
    ],
    "logic": [
        r"\b\d+(\.\d+)?\s*(%|percent)",
        r"\$\s?\d",
        r"\b(research|studies|study|evidence|data|statistics?|report(s|ed)?)\b",
        r"\b(fact|facts|proven|efficient|effective|impact|results?)\b",
        r"\b(every|each) (dollar|cent)\b",
        r"\b(because|therefore|so that|which means)\b",
    ],
    "emotion": [
        r"\b(imagine|picture)\b",
        r"\b(heart|hearts|feel|feeling|feelings|sad|suffer(ing)?|hungry|starv\w*|pain|hope|love)\b",
        r"\b(child|children|kids?|families|famil(y|ies)|mothers?|orphans?)\b",
        r"\b(touch(ed|ing)?|moving|heartbreaking|desperate|tragic)\b",
        r"\b(story|stories)\b",
    ],
}

# p4g: Wang et al.'s persuader strategies, grouped as the p4g lab game groups them.
P4G = {
    "foot-in-the-door": [
        r"\b(even|just) (a|one) (small|little|few)",
        r"\b(only|just) (\$?\d+|a (dollar|few (cents|dollars)))",
        r"\bany (amount|little bit)\b",
        r"\bsmall (amount|donation|step)",
    ],
    "propose": [
        r"\b(would|will|could|can) you (please )?(donate|give|contribute)",
        r"\bplease (donate|give|contribute)",
        r"\bhow much (would|will|could|can) you",
        r"\b(make|consider making) a donation",
        r"\bdonate (some|part) of your",
    ],
    "credibility": [
        r"\b(charity navigator|rated|reputable|trusted|transparent|accountab\w+|well[- ]known)\b",
        r"\b(since|founded in) (19|20)\d\d\b",
        r"\b(organization|charity) (has|is) (been )?(helping|working|recognized)",
    ],
    "story": [
        r"\bi (donated|gave|give|donate|have donated)\b",
        r"\b(my|our) (own )?(friend|family|daughter|son|experience)\b",
        r"\bwhen i was\b",
    ],
    "emotion": THEORY["emotion"],
    "logic": THEORY["logic"],
    "information": [
        r"\bsave the children\b",
        r"\b(deducted|deduct|from your (task )?payment|bonus|payment)\b",
        r"\b(website|url|www\.|\.org)\b",
    ],
    "inquiry": [
        r"(^|[.!?]\s*)(have|do|did|are|were) you (ever )?\w+[^.!?]*\?",  # a yes/no question opening a sentence
        r"\b((what|why|where) (do|did|would|are)|how (do|did|would)) you\b.*\?",  # not "how are you"
        r"\bare you (aware|familiar)\b",
    ],
    "small-talk": [r"\b(hi|hello|hey|thanks|thank you|good (morning|afternoon|evening)|how are you)\b"],
}

PATTERNS: dict[str, dict[str, list[str]]] = {"theory": THEORY, "p4g": P4G}


class StrategyClassifier:
    """``classify(text)`` -> one of ``strategies`` or :data:`OTHER` (module docstring)."""

    def __init__(self, game: str, strategies: Sequence[str]):
        if game not in PATTERNS:
            raise ValueError(f"no strategy patterns for lab game {game!r}; the classifier knows {sorted(PATTERNS)}")
        rules = PATTERNS[game]
        missing = set(strategies) - set(rules)
        if missing:
            raise ValueError(f"lab game {game!r} has strategies without patterns: {sorted(missing)}")
        self.strategies = tuple(strategies)
        self.order = [s for s in rules if s in self.strategies]  # tie-break: the order of PATTERNS
        self.rules = {s: [re.compile(p, re.IGNORECASE) for p in rules[s]] for s in self.order}

    def scores(self, text: str) -> dict[str, int]:
        """Distinct patterns matched, per strategy."""
        return {s: sum(1 for p in self.rules[s] if p.search(text)) for s in self.order}

    def classify(self, text: str) -> str:
        scores = self.scores(text)
        best = max(scores.values(), default=0)
        if best == 0:
            return OTHER
        return next(s for s in self.order if scores[s] == best)

    def index(self, text: str) -> int:
        """The strategy's index in ``strategies``; ``len(strategies)`` for :data:`OTHER`."""
        label = self.classify(text)
        return len(self.strategies) if label == OTHER else self.strategies.index(label)
