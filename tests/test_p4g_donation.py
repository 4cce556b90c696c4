"""The P4G donation parser: one message (`parse_donation`) and a whole episode (`episode_donation`)."""

from __future__ import annotations

import pytest

from scope_marl.core.types import Message
from scope_marl.envs.base import AGENT, USER
from scope_marl.envs.p4g.donation import episode_donation, parse_donation

# (persuadee message, dollars it commits to, or None for no commitment)
TAGS = [
    ("[DONATE $0.50]", 0.5),
    ("Okay, you convinced me. [GIVE $1]", 1.0),
    ("[donate 1.5]", 1.5),  # lowercase, no "$"
    ("[ DONATE $ 2 ]", 2.0),  # spaces inside
    ("[DONATE $1] hmm, no: [DONATE $0.25]", 0.25),  # the last tag wins
    ("I won't give you $2, but [GIVE $.75]", 0.75),  # the tag outranks the text
]
NUMBERS = [
    ("I'll give $0.50", 0.5),
    ("I will donate $1.5", 1.5),
    ("Ok, I'd like to donate .50", 0.5),  # a bare decimal is dollars
    ("I would like to donate 1 dollar", 1.0),
    ("I think I would like to donate 5", 5.0),  # a unitless integer after a giving verb
    ("I'd be happy to give 2$", 2.0),
    ("I will donate 50 cents", 0.5),
    ("how about .30 cents", 0.3),  # "0.30 cents" is how people write 30 cents
    ("Maybe 0.50? Sorry it's so little.", 0.5),  # a bare offer, even as a question
    ("$1.50 sounds good then.", 1.5),  # an amount, then agreement
]
WORDS = [
    ("I'll give a dollar", 1.0),
    ("Sure, I can donate one dollar.", 1.0),
    ("I will donate fifty cents", 0.5),
    ("fifty cents", 0.5),
    ("I can give two dollars", 2.0),
    ("I'll put in twenty-five cents", 0.25),
    ("i think i will donate one cent", 0.01),
    ("I'd give half a dollar", 0.5),  # half of a dollar, not half the payment
    ("Put me down for a dollar and a half", 1.5),
]
SHARES = [
    ("I'll give half of it", 1.0),
    ("I can donate half my payment", 1.0),
    ("Let's do half", 1.0),
    ("I'll give all of it", 2.0),
    ("I'll donate the whole $2", 2.0),
    ("Take everything, they need it more than I do", 2.0),
    ("They have lost everything, poor kids.", None),  # a share only as the object of giving
]
DENIALS = [
    ("I won't donate $1", 0.0),
    ("I won't donate 2", 0.0),  # the reference release scored this $2
    ("I'm not giving any money", 0.0),
    ("not even $0.10", 0.0),
    ("I don't want to donate", 0.0),
    ("no thanks, I'll keep it", 0.0),
    ("I can't donate more than $1", 1.0),  # a limit, not a refusal
    ("I don't mind giving $1", 1.0),  # not a denial
    ("I can't do much, but I'd be willing to donate $0.20", 0.2),  # the negation stays in its clause
    ("I refuse to donate $1", 0.0),
    ("I'd love to donate $2 but I can't.", 0.0),  # the verb left out
]
NO_COMMITMENT = [
    ("If I donate $25, does it help?", None),
    ("How much do people give?", None),
    ("$2 can buy a lot", None),
    ("Would you donate $1?", None),
    ("I have donated $100 to them before.", None),  # past giving
    ("I wish I could give $2", None),  # counterfactual
    ("I would donate $2 if I could", None),
    ("I spend about 5 dollars a day on coffee.", None),  # not a gift
    ("It takes 15 years to grow up.", None),
    ("Hello! How are you today?", None),
    ("", None),
    ("   ", None),
]
SEVERAL = [
    ("I was going to give $1 but I'll do $0.50", 0.5),  # the binding example (docs/interfaces.md), verbatim
    ("I earned $2 and I'll give $0.75 of it", 0.75),  # the binding example (docs/interfaces.md), verbatim
    ("I'll donate $1. Actually, make it $1.25.", 1.25),
    ("I won't donate $2, but I'll donate $1", 1.0),
    ("I'll give $1... no, I don't want to donate after all.", 0.0),
    ("Yes, I'm giving 0.1 not 0.01.", 0.1),  # a correction
    ("I'll give $1. I wish I could give more, but I can't.", 1.0),  # refuses more, not the $1
]
ABOVE_PAYMENT = [
    ("I'll donate $20 to them later", 20.0),  # unclamped
    ("I would like to make a 50 dollar donation", 50.0),
]


@pytest.mark.parametrize(
    "text,expected",
    TAGS + NUMBERS + WORDS + SHARES + DENIALS + NO_COMMITMENT + SEVERAL + ABOVE_PAYMENT,
)
def test_parse_donation(text, expected):
    got = parse_donation(text)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


def user(text: str) -> Message:
    return Message(role=USER, content=text)


def agent(text: str) -> Message:
    return Message(role=AGENT, content=text)


def test_episode_last_persuadee_amount_wins():
    messages = [
        agent("Would you donate to Save the Children?"),
        user("I'll give $1."),
        agent("Thank you! Anything more?"),
        user("Actually I'll do $0.50, money is tight."),
        agent("That's fine."),
        user("Thanks, have a nice day!"),  # no amount: the last one stands
    ]
    assert episode_donation(messages) == pytest.approx(0.5)


def test_episode_later_refusal_overrides():
    assert episode_donation([user("I'll give $1"), user("On second thought, I won't donate.")]) == 0.0


def test_episode_clamped_to_payment():
    assert episode_donation([user("I'll donate $20 to them later")]) == 2.0
    assert episode_donation([user("[DONATE $7]")]) == 2.0
    assert episode_donation([user("I won't donate $1")]) == 0.0
    amounts = [episode_donation([user(t)]) for t, _ in TAGS + NUMBERS + ABOVE_PAYMENT]
    assert all(0.0 <= a <= 2.0 for a in amounts)


def test_episode_ignores_persuader_amounts():
    assert episode_donation([agent("Could you give $2?"), user("Let me think about it.")]) == 0.0
    assert episode_donation([agent("I'll donate $1 myself."), user("I'll give 50 cents.")]) == pytest.approx(0.5)
    assert episode_donation([user("I'll give 50 cents."), agent("How about $1.50 instead?")]) == pytest.approx(0.5)


def test_episode_zero_when_no_amount():
    assert episode_donation([]) == 0.0
    assert episode_donation([agent("Would you give $1?"), user("Tell me more about them.")]) == 0.0


@pytest.mark.parametrize(
    "proposal,reply,expected",
    [
        ("How about $1?", "sure, I'll do that", 1.0),
        ("Could you give 50 cents?", "ok I will donate that", 0.5),
        ("Would you donate $1.50 today?", "yes, that works", 1.5),
    ],
)
def test_episode_acceptance_rule(proposal, reply, expected):
    messages = [agent(proposal), user(reply)]
    assert episode_donation(messages) == 0.0  # off by default: the reply states no amount
    assert episode_donation(messages, accept_proposals=True) == pytest.approx(expected)


def test_acceptance_rule_limits():
    on = {"accept_proposals": True}
    # The persuadee's own amount wins over the proposal.
    assert episode_donation([agent("How about $1?"), user("sure, I'll give 50 cents")], **on) == pytest.approx(0.5)
    # A refusal is not an acceptance.
    assert episode_donation([agent("How about $1?"), user("no thanks, I'll keep it")], **on) == 0.0
    # Only the message right before counts.
    assert episode_donation([agent("How about $1?"), user("hmm"), user("sure, I'll do that")], **on) == 0.0
    # The range of choices is not a proposal.
    assert episode_donation([agent("You can choose any amount from $0 to all your payment."), user("ok sure")], **on) == 0.0
    # A later question without an amount is what the "yes" answers.
    assert episode_donation([agent("How about $1? By the way, have you heard of them?"), user("yes")], **on) == 0.0
    # An earlier stated amount stands when an acceptance finds no proposal.
    assert episode_donation([user("I'll give $1"), agent("Great, thanks!"), user("sure")], **on) == 1.0
