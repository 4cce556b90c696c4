"""The LLM lab's strategy classifier: fixed rules, checked on hand-written messages."""

from __future__ import annotations

import pytest

from scope_marl.lab.classifier import OTHER, StrategyClassifier
from scope_marl.lab.games import GAMES, load_game


@pytest.mark.parametrize("name", GAMES)
def test_every_strategy_of_every_game_has_patterns(name):
    game = load_game(name)
    classifier = StrategyClassifier(name, game.strategies)
    assert set(classifier.order) == set(game.strategies)


THEORY_CASES = [
    ("Would you donate $1 to Save the Children today?", "ask"),
    ("Please give whatever you can.", "ask"),
    ("Imagine a hungry child waiting for a meal tonight.", "emotion"),
    ("Every family we reach has a story of hope.", "emotion"),
    ("Research shows 90% of every dollar reaches the programs.", "logic"),
    ("The evidence is clear: these programs are effective.", "logic"),
    ("The weather is nice today.", OTHER),
    ("", OTHER),
]


@pytest.mark.parametrize(("text", "expected"), THEORY_CASES)
def test_theory_messages(text, expected):
    assert StrategyClassifier("theory", load_game("theory").strategies).classify(text) == expected


P4G_CASES = [
    ("Even a small donation of just $1 helps.", "foot-in-the-door"),
    ("Could you donate part of your payment to the charity?", "propose"),
    ("Save the Children is rated highly by Charity Navigator and is very transparent.", "credibility"),
    ("I donated last year myself, and my friend did too.", "story"),
    ("Have you ever heard of this charity?", "inquiry"),
    ("Hello! How are you doing?", "small-talk"),
    ("Purple elephants dance quietly.", OTHER),
]


@pytest.mark.parametrize(("text", "expected"), P4G_CASES)
def test_p4g_messages(text, expected):
    assert StrategyClassifier("p4g", load_game("p4g").strategies).classify(text) == expected


def test_the_most_matched_strategy_wins_and_ties_go_to_the_first_listed():
    classifier = StrategyClassifier("theory", ("emotion", "logic", "ask"))
    # one logic pattern, three emotion patterns
    assert classifier.classify("Imagine the children: their hearts, and the research.") == "emotion"
    # one pattern each: ask is listed first in the theory rules
    assert classifier.scores("Would you donate to help children?")["ask"] == 1
    assert classifier.classify("Would you donate to help children?") == "ask"
    assert classifier.index("Would you donate to help children?") == 2
    assert classifier.index("nothing to see") == 3  # OTHER is one past the strategies


def test_unknown_game_or_strategy_is_refused():
    with pytest.raises(ValueError, match="no strategy patterns for lab game 'chess'"):
        StrategyClassifier("chess", ("e4",))
    with pytest.raises(ValueError, match="strategies without patterns: \\['bribe'\\]"):
        StrategyClassifier("theory", ("emotion", "bribe"))


@pytest.mark.parametrize(
    "text, label",
    [
        ("Donate to Save the Children today. You'll save lives.", "ask"),
        ("You can donate to their mission and help them.", "ask"),
        ("Can you help us reach our goal?", "ask"),
        ("The campaign encourages people to donate to organizations.", "other"),
    ],
)
def test_direct_asks_in_the_llm_agents_words(text, label):
    assert StrategyClassifier("theory", ("emotion", "logic", "ask")).classify(text) == label
