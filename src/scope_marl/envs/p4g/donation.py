"""How much did the persuadee promise? Reading a donation out of Persuasion for Good messages.

The P4G reward is the amount the persuadee (role ``user``) commits to give out of a $2 task
payment. Models, and the people in the corpus, state it in many ways: an explicit tag
(``[DONATE $0.50]``), plain amounts ("50 cents", "a dollar", ".50"), fractions of the payment
("half of it", "all of it") or a refusal ("no thanks, I'll keep it").

Why not reuse the reference release's regex: it took the last number in the persuadee's text with
no notion of negation or of who commits to what, so "I won't donate 2" scored $2 and a question
("If I donate $25, does it help?") scored $25. A reward with that bug pays a policy for getting
numbers said rather than for persuading, and we must not copy it. This parser reads each amount
*in its clause*:

* an amount counts only where the speaker commits to it: first-person intent ("I'll", "I would
  like to", "let's"), an imperative ("take .50"), an offer ("how about $1?") or a bare answer
  ("Maybe 0.50?", "$0.50 it is");
* a negated amount or a refusal ("I won't donate $1", "not even $0.10", "no thanks") reads as 0;
* questions, conditionals ("if I donate $25, ..."), past or habitual giving ("I have donated
  $100") and amounts that describe the payment itself ("I earned $2") count for nothing;
* with several commitments the last one wins ("I was going to give $1 but I'll do $0.50").

:func:`parse_donation` returns amounts unclamped; :func:`episode_donation` clamps the episode's
result to the task's [0, 2] range. ``bench/p4g_donation_parser.py`` measures the parser against the
corpus annotations. Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scope_marl.core.types import Message
from scope_marl.envs.base import AGENT, USER

PAYMENT = 2.0  # dollars: the task payment a persuadee can give part of

__all__ = ["PAYMENT", "Mention", "episode_donation", "has_donation_tag", "mentioned_amounts", "parse_donation", "proposed_amount"]


def _rx(*parts: str) -> re.Pattern[str]:
    """One case-insensitive regex from pieces (so long alternations read one per line)."""
    return re.compile("".join(parts), re.I)


# ============================================================================================
# Amount mentions: the ways the corpus writes an amount, with its value in dollars
# ============================================================================================

_UNITS = {
    "zero": 0,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "thirteen": 13,
    "fourteen": 14,
    "fifteen": 15,
    "sixteen": 16,
    "seventeen": 17,
    "eighteen": 18,
    "nineteen": 19,
}
_TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90}
# A number in words: "fifty", "twenty five", "twenty-five", "a hundred", "one".
_WORD_NUMBER = (
    r"(?:(?:a|one)\s+hundred|(?:"
    + "|".join(_TENS)
    + r")(?:[\s-]+(?:"
    + "|".join(_UNITS)
    + r"))?|"
    + "|".join(sorted(_UNITS, key=len, reverse=True))
    + ")"
)
# A number in digits: "2", "0.50", ".5", "1,000".
_DIGITS = r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
_DOLLARS = r"(?:dollars?|bucks?|usd)"
_CENTS = r"(?:cents?|c|¢|pennies)"
_PAYMENT_NOUN = r"(?:payment|payout|pay|earnings|money|bonus|reward|compensation|amount|income)"
_TWO_DOLLARS = r"(?:\$\s*2(?:\.00)?|2\s+dollars|two\s+dollars)"
# What a number counts when it is not money: "86.5%", "15 years", "1000 children", "5.6 million".
_NOT_MONEY_AFTER = (
    r"\s*%|\s*(?:percent|per\s*cent|million|billion|thousand|hundred|years?|months?|weeks?|days?|hours?|"
    r"minutes?|seconds?|times?|people|persons?|children|kids|babies|turns?|rounds?|messages?|out\s+of|"
    r"of\s+(?:them|us|every|all)|st|nd|rd|th|am|pm|x|more)\b"
)
_MONEY_NEXT = "(?!" + _NOT_MONEY_AFTER + ")"

# The task's own tag, which a policy may be prompted to emit: it outranks everything else.
_TAG = _rx(r"\[\s*(?:donate|give)\s*:?\s*\$?\s*(\d+(?:\.\d*)?|\.\d+)\s*\]")


def has_donation_tag(text: str) -> bool:
    """Whether a message states its decision in the ``[DONATE $N]`` / ``[GIVE $N]`` format ($0 included)."""
    return _TAG.search(text) is not None


@dataclass(frozen=True)
class Mention:
    """One amount in a text: its value in dollars and where it sits.

    ``kind`` is "money" (a currency or unit says so), "fraction" (a share of the payment: "half",
    "all of it", "10%") or "bare" (a unitless integer). The last two count only as the object of a
    giving verb ("donate 5", "give half"), never in "5 kids" or "they lost everything".
    """

    value: float
    start: int
    end: int
    kind: str = "money"


def _word_number(words: str) -> float:
    parts = [p for p in re.split(r"[\s-]+", words.lower()) if p]
    if parts[-1] == "hundred":
        return 100.0
    return float(sum(_TENS.get(p, 0) + _UNITS.get(p, 0) for p in parts))


def _digits(text: str) -> float:
    return float(text.replace(",", ""))


def _cents(text: str) -> float:
    """ "50 cents" is $0.50. A decimal below 1 with "cents" ("0.30 cents", ".05 cents") is how people
    write dollars here, and how the corpus annotators read it in all but one case."""
    x = _digits(text)
    return x if "." in text and x < 1 else x / 100


Value = Callable[[re.Match[str]], float]

# (regex, value of a match, kind), by priority: where two overlap the earlier one keeps the text,
# so "half a dollar" is 0.5 (not half the payment, then a dollar) and "the whole $2" is one mention.
_PATTERNS: list[tuple[re.Pattern[str], Value, str]] = [
    # Fractions of a dollar, not of the payment: "half a dollar", "a dollar and a half".
    (_rx(r"\bhalf\s+(?:of\s+)?(?:a|one|1)\s+dollars?\b|\b(?:a\s+)?half[\s-]+(?:a\s+)?dollar\b"), lambda m: 0.5, "money"),
    (_rx(r"\b(?:a|one|1)\s+dollar\s+and\s+(?:a\s+)?half\b|\b(?:one|1)\s+and\s+a\s+half\s+dollars?\b"), lambda m: 1.5, "money"),
    # The whole payment: "all of it", "all (of) my payment", "all $2", "give it all", "the whole
    # $2", "my entire bonus", "everything". A bare "all" ("that is all I can") is not one.
    (
        _rx(
            r"\ball\s+(?:of\s+)?(?:it|that|this)\b",
            r"|\ball\s+(?:of\s+)?(?:my|the|your|our)\s+(?:",
            _TWO_DOLLARS,
            r"\s+)?(?:(?:task|hit|mturk)\s+)?",
            _PAYMENT_NOUN,
            r"\b",
            r"|\ball\s+(?:of\s+)?(?:the\s+)?",
            _TWO_DOLLARS,
            r"\b",
            r"|\bit\s+all\b",
            r"|\b(?:the|my)\s+(?:whole|entire|full)\s+(?:",
            _TWO_DOLLARS,
            r"\s*)?(?:(?:task|hit)\s+)?",
            r"(?:",
            _PAYMENT_NOUN,
            r"|thing|lot)?\b(?<!\s)",
            r"|\beverything\b",
        ),
        lambda m: PAYMENT,
        "fraction",
    ),
    # Half or a quarter of the payment: "half", "1/2", "half of it", "half my payment".
    (
        _rx(
            r"(?:\bhalf\b|(?<![\d/])1/2(?![\d/]))",
            r"(?:\s+(?:of\s+)?(?:it|that|this|(?:my|the|your|our)\s+(?:(?:task|hit)\s+)?",
            _PAYMENT_NOUN,
            r"))?",
        ),
        lambda m: PAYMENT / 2,
        "fraction",
    ),
    (_rx(r"\ba\s+quarter\s+of\s+(?:it|that|this|(?:my|the|your|our)\s+\w+)"), lambda m: PAYMENT / 4, "fraction"),
    # A percentage given is a share of the payment: "I could do 10%".
    (_rx(r"(?<![\w.])(\d{1,3}(?:\.\d+)?)\s*(?:%|percent\b)"), lambda m: PAYMENT * _digits(m.group(1)) / 100, "fraction"),
    # Nothing, as an amount: "I'll give nothing", "not a penny".
    (_rx(r"\b(?:nothing|not\s+(?:a|one)\s+(?:penny|cent|dime|dollar))\b"), lambda m: 0.0, "money"),
    # A currency sign before or after digits: "$0.50", "$ 1", "$.50", "2$", "1.00$".
    (_rx(r"\$\s*(", _DIGITS, r")(?:\s*", _DOLLARS, r"\b)?"), lambda m: _digits(m.group(1)), "money"),
    (_rx(r"(?<![\w.])(", _DIGITS, r")\s*\$"), lambda m: _digits(m.group(1)), "money"),
    # Digits with a unit: "2 dollars", "50 cents", "50c", "0.30 cents".
    (_rx(r"(?<![\w.])(", _DIGITS, r")\s*", _DOLLARS, r"\b"), lambda m: _digits(m.group(1)), "money"),
    (_rx(r"(?<![\w.])(", _DIGITS, r")\s*", _CENTS, r"(?!\w)"), lambda m: _cents(m.group(1)), "money"),
    # Words with a unit: "one dollar", "a dollar", "one whole dollar", "fifty cents", "a penny".
    (
        _rx(r"\b(", _WORD_NUMBER, r"|a)\s+(?:whole\s+|full\s+|single\s+)?", _DOLLARS, r"\b"),
        lambda m: 1.0 if m.group(1).lower() == "a" else _word_number(m.group(1)),
        "money",
    ),
    (_rx(r"\b(", _WORD_NUMBER, r")\s+", _CENTS, r"\b"), lambda m: _word_number(m.group(1)) / 100, "money"),
    (_rx(r"\b(?:a|one|single|my|your|the|that)\s+(?:penny|cent)\b"), lambda m: 0.01, "money"),
    (_rx(r"\ba\s+dime\b"), lambda m: 0.10, "money"),
    (_rx(r"\ba\s+nickel\b"), lambda m: 0.05, "money"),
    (_rx(r"\ba\s+quarter\b"), lambda m: 0.25, "money"),
    # A decimal without a unit (".50", "0.25", "1.00") is dollars: here decimals nearly always are.
    (_rx(r"(?<![\w.$,])(\d*\.\d+)(?!\w|\.\d)", _MONEY_NEXT), lambda m: _digits(m.group(1)), "money"),
    # Integers without a unit: money only as the object of a giving verb ("I'd like to donate 5").
    (_rx(r"(?<![\w.$,/-])(\d{1,6})(?![\w,/:-]|\.\d)", _MONEY_NEXT), lambda m: _digits(m.group(1)), "bare"),
    (_rx(r"\b(", _WORD_NUMBER, r")\b", _MONEY_NEXT), lambda m: _word_number(m.group(1)), "bare"),
]


def mentioned_amounts(text: str) -> list[Mention]:
    """Every amount the text mentions, in order, committed to or not (also used by the benchmark)."""
    taken: list[Mention] = []
    for regex, value, kind in _PATTERNS:
        for m in regex.finditer(text):
            if not any(m.start() < t.end and t.start < m.end() for t in taken):
                taken.append(Mention(value(m), m.start(), m.end(), kind))
    return sorted(taken, key=lambda t: t.start)


# ============================================================================================
# Sentences and clauses: the scope in which intent, negation and conditions apply
# ============================================================================================

# Sentence ends. A period before a digit is a decimal point (".50"), not an end.
_SENTENCE_END = _rx(r"[!?;\n]+|\.+(?!\d)")
# Clause breaks inside a sentence: commas (not in "1,000"), spaced dashes, contrastive or causal
# conjunctions, and "and"/"so"/"or"/"then" when a new subject follows ("I earned $2 and I'll
# give..."), so that "I don't have much, but I'll give $1" does not negate the $1.
_CONJUNCTIONS = "but|however|although|though|because|cause|since|except|whereas|otherwise"
_CLAUSE_BREAK = _rx(
    r",(?!\d)|\s[-–—]+|[-–—]+\s|(?<=\d)[-–—](?=[a-z])|:|\(|\)",
    r"|\b(?:",
    _CONJUNCTIONS,
    r")\b",
    r"|\b(?:and|so|or|then)\b(?=\s+(?:i|i'll|ill|i'd|i'm|im|i've|we|we'll|let's|lets|it's|that's|you)\b)",
)
# What opened a clause (punctuation, a conjunction), skipped so the clause starts at its words.
_CLAUSE_OPENER = _rx(r"[\s,:;()–—-]*(?:(?:", _CONJUNCTIONS, r"|and|so|or|then)\b)?[\s,]*")
# A clause that opens like a question, even without "?" ("would donating one penny help").
_INTERROGATIVE = _rx(
    r"^\W*(?:(?:so|and|ok|okay|well|oh|hmm|um)\W+)*",
    r"(?:how|what|why|when|where|who|which|would|could|can|will|do|does|did|is|are|should|shall|may|might|",
    r"hows|how's|whats|what's)\b",
)


@dataclass(frozen=True)
class Clause:
    start: int  # after the opening conjunction or punctuation
    end: int
    asks: bool  # the clause ends a sentence that ends with "?"

    def text(self, full: str) -> str:
        return full[self.start : self.end]


def _clauses(text: str) -> list[Clause]:
    out: list[Clause] = []
    start = 0
    for end_mark in [*_SENTENCE_END.finditer(text), None]:
        end = end_mark.start() if end_mark else len(text)
        cuts = [start, *(b.start() for b in _CLAUSE_BREAK.finditer(text, start, end)), end]
        pieces = []
        for a, b in zip(cuts, cuts[1:]):
            a = _CLAUSE_OPENER.match(text, a, b).end()
            if text[a:b].strip():
                pieces.append((a, b))
        asks = bool(end_mark and "?" in end_mark.group())
        out += [Clause(a, b, asks and i == len(pieces) - 1) for i, (a, b) in enumerate(pieces)]
        if end_mark:
            start = end_mark.end()
    return out


def _sentence_start(text: str, pos: int) -> int:
    return max([0] + [m.end() for m in _SENTENCE_END.finditer(text, 0, pos)])


# ============================================================================================
# Reading one amount in its clause. Each regex below is matched against the clause text to the
# left of the amount ("left") or to its right ("right").
# ============================================================================================

_I = r"(?:i|we|ill|im|id)"  # "ill", "im", "id": "I'll", "I'm", "I'd" typed without apostrophes
_ADVERB = (
    r"(?:(?:also|really|definitely|probably|still|just|only|actually|surely|certainly|then|too|now|"
    r"totally|happily|gladly|think|guess)\s+)?"
)
# Intent: "I'll", "I would like to", "we can", "I'm willing to", "I've decided", "I promised",
# "I was thinking", "let's", "put me down for", "you can have". Plain present or past ("I donate",
# "I donated") is habit or history, not a commitment, and is left out on purpose.
_INTENT = _rx(
    r"\b",
    _I,
    r"\s*",
    _ADVERB,
    r"(?:'ll|'l|'d|will|would|shall|can|could|may|might|should|must|am|'m|want|wanna|wish|plan|intend|hope|",
    r"decided?|choose|chose|agree|pledge|promised?|guess|think|feel\s+like|prefer|confirm|offer|commit|opt|refuse|",
    r"like\s+to|love\s+to|accept|(?:was|were)\s+thinking|(?:'ve|have)\s+(?:decided|promised|chosen|pledged|agreed))\b",
    r"|\b(?:i'll|i'l|ill|we'll|i'd|we'd|imma|i'ma)\b",
    r"|(?:n't|\bnot|\bdont)\s+mind\b|\bconsidering\b",
    r"|\b(?:happy|glad|willing|ready|able|okay|ok|fine|comfortable|down)\s+(?:to|with|for|donating|giving)\b",
    r"|\blean(?:ing)?\s+(?:towards?|to)\b",
    r"|\b(?:let's|lets|let\s+me|let\s+us)\b",
    r"|\bmy\s+(?:final\s+|last\s+|best\s+)?(?:donation|pledge|contribution|gift|offer)\b",
    r"|\b(?:put|sign|count|mark)\s+me\s+(?:down|up|in)\b",
    r"|\byou\s+(?:can|may|could)\s+(?:have|take|put|count|deduct|use)\b",
)
# An imperative opening the clause (after at most one interjection): "take .50", "go ahead and
# take", "finnne take the $1.25", "donate $1 for me", "make it $1".
_IMPERATIVE = _rx(
    r"^\W*(?:[a-z]+\W+)?(?:(?:then|please|just|go\s+ahead\s+and)\s+)?(?:take|deduct|put|use|donate|give|send|submit|pledge|contribute|make\s+it)\b"
)
# An offer, often as a question: "how about $1?", "Maybe 0.50?", "hows $0.50 sound?",
# "is $20 okay?", "Could I pledge $1?", "Would $1 help?".
_OFFER_WORD = _rx(r"\b(?:how\s+about|what\s+about|maybe|perhaps|how's|hows)\b")
_OFFER_QUESTION = _rx(
    r"^\W*(?:(?:so|and|ok|okay|well|then|um|hmm|oh)\W+)*(?:how\s+does|how\s+would",
    r"|what\s+if\s+i\s+(?:give|donate|do)",
    r"|(?:can|could|may|might|shall)\s+(?:i|we)\s+(?:just\s+|only\s+)?",
    r"(?:do|give|donate|pledge|offer|contribute|go\s+with|make\s+it|put)",
    r"|would\s+you\s+(?:be\s+(?:ok|okay|fine|happy|alright)\s+(?:with|taking)|accept|take)",
    r"|(?:is|would|will)\s+(?!you\b).{0,40}\b(?:ok|okay|fine|enough|alright|acceptable|good|work|do|help|sound\w*)\b)",
)
# A giving verb right before the amount: what a bare number or a share needs ("donate 5",
# "do 10", "promised 10", "give you half", "donate everything").
_GIVING_VERB_BEFORE = _rx(
    r"\b(?:donat\w*|giv\w*|do|doing|pledg\w*|contribut\w*|offer\w*|spare|promised?|go\s+with|make\s+it|say|",
    r"take|send|put\s+in|chip\s+in)\s+",
    r"(?:(?:you|them|it|him|her|about|around|maybe|like|just|only|at\s+least|probably|roughly|approximately|",
    r"another|an|a|the|now|today|tonight)\s+)*$",
)
# The amount describes the payment or an earning, not a gift: "I earned $2", "out of $2",
# "it's paying me .30", "I only have $2", "$2 payment"...
_PAYMENT_BEFORE = _rx(
    r"\b(?:earn\w*|make|makes|making|made|paid|paying(?:\s+me)?|pays(?:\s+me)?|spen[dt]\w*|cost\w*|worth|",
    r"sav(?:e|ed|ing)|(?:i|we)\s+(?:only\s+|just\s+|still\s+)?(?:have|had)|has|get|gets|got|receiv\w*|",
    r"out\s+of|(?:of|from)\s+(?:my|the|our|your|this|that)|with\s+(?:my|the|only))\s+",
    r"(?:(?:about|around|only|just|like|roughly|a|an|the|my|our|total|whole|entire|full|maybe)\s+)*$",
)
_PAYMENT_AFTER = _rx(
    r"^\s*(?:(?:task|hit|mturk|turk)\s+)?(?:payment|pay|paycheck|bonus|earnings|reward|compensation|salary|wage|",
    r"i\s+(?:earn|earned|made|make|get|got|receive|received|will\s+(?:earn|get|make)|'ll\s+(?:earn|get|make)))\b",
)
# ...unless it is made or given: "make a $20 donation", "I'll donate my hard earned $0.30".
_GIFT_NOUN_AFTER = _rx(r"^\s*(?:donation|contribution|pledge|gift|difference)\b")
_GIVES_PAYMENT = _rx(
    r"\b(?:donat\w*|give|giving|contribut\w*|pledg\w*|submit|send)\s+(?:all\s+(?:of\s+)?)?(?:my|the|this|that|our)\s+(?:[\w-]+\s+){0,2}$"
)
# A range from nothing quotes the task's choice rather than making one: "0 to 2 dollars".
_ZERO = r"(?:\$\s*0|\b0|\bzero|\bnothing)(?:\.0+)?\s*(?:dollars?\s*)?"
_ZERO_RANGE_BEFORE = _rx(_ZERO, r"(?:to|-|–|and)\s*$")
_ZERO_RANGE_FROM_HERE = _rx(_ZERO.replace(r"\b", ""), r"(?:to|-|–)\s*(?:\$|\d|all|the|two|one|a\b)")
# Conditions and counterfactuals: nothing is promised (yet). "How about if I do 0.75" is an offer.
_CONDITION = _rx(r"(?<!about\s)(?<!what\s)\b(?:if|unless|whether|suppose|supposing|in\s+case|when|whenever)\b")
# "If it were another charity, I'd give it all", "I wish I could give $2", "I would donate $2 if I could".
_COUNTERFACTUAL = _rx(r"\bif\s+(?:\w+\s+){1,2}?(?:were|had|did)\b|\bif\s+only\b")  # in the sentence
_WISH = _rx(r"\bwish\s+(?:i|we)\s+(?:could|had|were|was)\b")  # in the clause
_COUNTERFACTUAL_AFTER = _rx(r"[^.!?;]*?\bif\s+(?:i|we)\s+(?:could|had|were|was|did)\b")
# Plans given up, and giving already done: "I was going to give $1", "I have donated $100", "I gave".
_PAST = _rx(
    r"\b(?:was|were)\s+(?:going\s+to|gonna|planning|about\s+to)\b|\bused\s+to\b",
    r"|\b(?:had|have|'ve)\s+(?:already\s+)?(?:donated|given|gave)\b",
    r"|\b(?:would|could|should|might)(?:'ve|\s+have)\s+(?:\w+\s+)?(?:donated|given|gave|done|paid)\b",
)
_SIMPLE_PAST = _rx(r"\b(?:donated|gave)\b")
_FUTURE = _rx(r"\b(?:will|'ll|would|'d|going\s+to|gonna|want|plan)\b")
# Words that negate what follows...
_NEGATOR = _rx(
    r"n't\b|\b(?:not|no|never|nor|neither|wont|cant|cannot|dont|didnt|wouldnt|couldnt|isnt|aint|", r"refuse|refusing|decline|declining)\b"
)
# ...except in phrases that do not deny the gift: hedges ("not sure", "don't mind") and idioms.
_NOT_A_DENIAL = _rx(
    r"\bnot\s+(?:sure|certain|much|a\s+lot|that\s+much|only|bad|a\s+problem)\b|\bno\s+(?:problem|doubt|matter|worries)\b",
    r"|(?:n't|\bnot|\bdont|\bcant)\s+(?:mind|hurt|hesitate|wait|go\s+wrong|help\s+but)\b",
    r"|\bwhy\s+not\b|\bif\s+not\b",
)
# "<amount> not <amount>": a correction; the second amount is the one not meant.
_CORRECTION = _rx(r"(?:", _DIGITS, r"|\$|cents?|dollars?)\s*,?\s*(?:and\s+)?not\s*$")
# A limit states the amount, negated or not: "I can't do more than $1", ".25 is the most I can".
_LIMIT_BEFORE = _rx(r"\b(?:more\s+than|over|above|up\s+to|at\s+most|max(?:imum)?)\s*$")
_LIMIT_AFTER = _rx(
    r"^\s*(?:is|would\s+be|will\s+be)\s+(?:the\s+most|all\s+i|as\s+much\s+as|my\s+(?:max|limit))\b",
    r"|^\s*(?:max(?:imum)?|tops|at\s+most)\b",
)
# An amount opening its clause, then agreed to: "$0.25 is a good amount", ".60 still sounds good",
# "$5.00 i would donate", "30 cents for the children is okay with me", "100$ donate", "$0.50 it is".
_AGREED_AFTER = _rx(
    r"^\s*(?:(?:still|then|it|is|would|will|should|be|sounds?|seems?|for\s+(?:me|now|sure|today|the\s+\w+|them)|",
    r"from\s+me|to\s+me|with\s+me|really|very|pretty|quite|a|an|totally|definitely|ok|okay|i\s+think)\s+)*",
    r"(?:good|fine|ok|okay|nice|enough|reasonable|fair|great|doable|perfect|alright|acceptable|best|firm|works?|",
    r"agreed|deal|it\s+is|it|the\s+amount|my\s+(?:donation|offer|pledge|final)|what\s+i|all\s+i|",
    r"i\s+(?:will|would|can|could|'ll|'d|am)|ill|i'll|i'd|donate|give|please)\b",
)
# Words that may stand around an amount in a bare answer ("Yes, $1 please", "ok, maybe .50"),
# and where the gift goes ("20 dollars for them", ".50 to the charity").
_FILLER = frozenset(
    "yes yeah yep yup ok okay sure maybe perhaps um uh well then please how about what hows how's i guess think "
    "say let's lets just only like around approximately probably so fine good great alright it is it's sounds "
    "sound works work that's that for now today tonight right oh hmm hm thanks thank you deal of course "
    "definitely totally cool and be would will do go with at least most max wow which".split()
)
_RECIPIENT = _rx(
    r"\b(?:for|to|towards?)\s+(?:them|the\s+(?:children|kids|charity|cause|organization)|save\s+the\s+children|",
    r"(?:the\s+)?charity)\b",
)
_WORD = _rx(r"[a-z']+|\d")


def _only_fillers(text: str) -> bool:
    return all(w.lower() in _FILLER for w in _WORD.findall(_RECIPIENT.sub(" ", text)))


def _blank(text: str, spans: list[tuple[int, int]]) -> str:
    for a, b in sorted(spans, reverse=True):
        text = text[:a] + " " + text[b:]
    return text


# A reported clause starts a new negation scope: "Don't judge me for saying that I can only give .25".
_REPORTED = _rx(r"\b(?:that|saying|say|said)\s+(?=(?:i|we)\b)")


def _negated(left: str) -> bool:
    scope = _REPORTED.split(left)[-1]
    return bool(_NEGATOR.search(_NOT_A_DENIAL.sub(" ", scope)))


def _is_past(left: str) -> bool:
    return bool(_PAST.search(left) or (_SIMPLE_PAST.search(left) and not _FUTURE.search(left)))


def _describes_payment(left: str, right: str) -> bool:
    earned = _PAYMENT_BEFORE.search(left) and not _GIFT_NOUN_AFTER.search(right)
    return bool((earned or _PAYMENT_AFTER.search(right)) and not _GIVES_PAYMENT.search(left))


def _read_mention(text: str, clause: Clause, mention: Mention, mentions: list[Mention]) -> float | None:
    """The dollars this mention commits the speaker to (0.0 when denied), or None for no commitment."""
    words = clause.text(text)
    left, right = text[clause.start : mention.start], text[mention.end : clause.end]
    neighbours = [m for m in mentions if clause.start <= m.start < clause.end]
    spans = [(m.start - clause.start, m.end - clause.start) for m in neighbours]
    bare_answer = _only_fillers(_blank(words, spans))  # "Maybe 0.50?", "Yes, $1 please"
    leads = _only_fillers(_blank(left, spans)) and bool(_AGREED_AFTER.search(right))  # "$1 sounds good"
    limit = bool(_LIMIT_AFTER.search(right) or _LIMIT_BEFORE.search(left))

    # What the amount is about: not a gift, or not (yet) promised.
    if _describes_payment(left, right):
        return None
    if _ZERO_RANGE_BEFORE.search(left) or _ZERO_RANGE_FROM_HERE.match(text, mention.start):
        return None
    if _CONDITION.search(left) or _is_past(left):
        return None
    if _COUNTERFACTUAL.search(text[_sentence_start(text, mention.start) : mention.start]) or _WISH.search(left):
        return None
    if _COUNTERFACTUAL_AFTER.match(text, mention.end):
        return None
    if mention.kind != "money" and not (_GIVING_VERB_BEFORE.search(left) or bare_answer or leads):
        return None
    if mention.kind == "fraction" and any(m.kind == "money" for m in neighbours):
        return None  # "0.15, half of my payment": the explicit amount says what the share meant

    # Whether the speaker commits to it.
    offer = bool(_OFFER_WORD.search(left) or _OFFER_QUESTION.search(words))
    committed = bool(_INTENT.search(left) or _IMPERATIVE.search(left) or offer or bare_answer or leads or limit)
    if clause.asks or _INTERROGATIVE.match(words):
        asks_about_it = bool(_INTERROGATIVE.match(words)) and not offer
        if not (bare_answer or offer or (committed and not asks_about_it)):
            return None  # a real question ("Would donating help?"), not an offer or an uptalk "I'll give $1?"
        committed = True

    # Whether it is denied.
    if _negated(left) and not limit:
        if _CORRECTION.search(left):
            return None  # "I'm giving 0.1 not 0.01"
        if mention.kind == "fraction":
            return None  # "I'm not doing half" denies the share, not the gift
        return 0.0 if (committed or re.search(r"\beven\b", left, re.I)) else None  # "not even $0.10"
    return mention.value if committed else None


# ============================================================================================
# Refusals without an amount
# ============================================================================================

_GIVE = (
    r"(?:donat(?:e|es|ing|ion|ions)|giv(?:e|es|ing)|contribut\w*|spare|part\s+with|pay|pledge|help\s+out|"
    r"do\s+(?:that|it|so))"
)
_OTHER_SUBJECT = r"(?:you|they|he|she|people|others|anyone|everyone|somebody|someone)"
# "I won't donate", "I don't want to give", "I'm not giving any money", "I can't afford to donate",
# "I am not willing to do that", "no thanks", "I'll keep it", "I'll pass". Not refusals: "I can't
# donate more", "I don't mind giving", "I don't usually donate" (habit), "I do not see you donating",
# "I can not donate until the end".
_REFUSAL = _rx(
    r"\b",
    _I,
    r"\s*(?:(?:do|will|would|can|could|am|'m|shall|should)\s*(?:not|n't)|won'?t|can'?t|cannot|don'?t|",
    r"'m\s+not|am\s+not|'d\s+rather\s+not|would\s+rather\s+not|prefer\s+not|'ll\s+not|will\s+not|'m\s+unable|",
    r"am\s+unable)\s+",
    r"(?!(?:mind|hesitate|wait|help|usually|normally|typically|often|always|ever|generally|regularly|know)\b)",
    r"(?:(?!",
    _OTHER_SUBJECT,
    r"\b)\w+\s+){0,4}?",
    _GIVE,
    r"\b",
    r"(?!\s+(?:more|much|half|a\s+lot|that\s+much|as\s+much|too\s+much|all|everything|the\s+(?:whole|full|entire)|",
    r"any\s*more|over|above|other|to\s+(?:other|another|those|them)|twice|again|another|until|till|before)\b)",
    r"|\bno,?\s+thanks?\b|\bno\s+thank\s+you\b|\bno\s+way\s+(?:i|i'm|i'll|am\s+i|will\s+i|would\s+i)\b",
    r"|\b",
    _I,
    r"\s*(?:can'?t|cannot|can\s+not|couldn'?t)\s+(?:really\s+)?afford\s+(?:it|that|this)\b",
    r"|\b(?:i'll|i\s+will|ill|i'd\s+rather|i\s+would\s+rather|i'm\s+going\s+to|i\s+am\s+going\s+to|i'm\s+gonna|",
    r"i\s+want\s+to|i'd\s+like\s+to|i\s+would\s+like\s+to|i\s+have\s+to|i\s+need\s+to)\s+(?:just\s+)?keep\s+",
    r"(?!(?:the\s+)?(?:other|rest|remainder|remaining|change|difference)\b)(?:it|my|the|all|everything)\b",
    r"|\b(?:i'll|i\s+will|i'd\s+rather|i\s+must|i\s+have\s+to|i'm\s+going\s+to)\s+pass\b",
    r"|\b(?:i'm|i\s+am|im)\s+not\s+(?:really\s+|very\s+)?interested\b|\bi'd\s+rather\s+not\b",
)


# A refusal with the verb left out: "I'd love to give $2 but I can't." Not when what is refused is
# more than was given: "I'll give $1. I wish I could give more, but I can't."
_ELLIPTICAL_REFUSAL = _rx(r"\b", _I, r"\s*(?:just\s+|really\s+)?(?:can'?t|cannot|can\s+not|won'?t|will\s+not|couldn'?t)\s*(?:[.!,;]|$)")
_MORE = _rx(r"\b(?:more|much|else|extra|higher|bigger|larger)\b")


def _refusals(text: str) -> list[int]:
    """Where the text refuses to give (positions): each reads as a $0 commitment there."""
    found = []
    for m in _REFUSAL.finditer(text):
        before = re.split(r"[,.;!?]", text[max(0, m.start() - 40) : m.start()])[-1]
        if not (_CONDITION.search(before) or _PAST.search(m.group())):
            found.append(m.start())
    for m in _ELLIPTICAL_REFUSAL.finditer(text):
        if not _MORE.search(text[max(0, m.start() - 80) : m.start()]):
            found.append(m.start())
    return sorted(found)


# ============================================================================================
# Public interface
# ============================================================================================

_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "`": "'"})


def _normalize(text: str) -> str:
    """Straight apostrophes, and quotes unescaped (the corpus has "I\\'ll")."""
    return text.translate(_APOSTROPHES).replace("\\'", "'").replace('\\"', '"')


def parse_donation(text: str) -> float | None:
    """The donation one persuadee message states, in dollars (unclamped), or None if it states none.

    A ``[DONATE $N]`` / ``[GIVE $N]`` tag wins (the last one if several). Otherwise the last amount
    the speaker commits to, where a refusal or a negated amount reads as 0.0.
    """
    if not text or not text.strip():
        return None
    tags = _TAG.findall(text)
    if tags:
        return float(tags[-1])
    text = _normalize(text)
    mentions = mentioned_amounts(text)
    events = [(pos, 0.0) for pos in _refusals(text)]
    for clause in _clauses(text):
        for mention in mentions:
            if clause.start <= mention.start < clause.end:
                value = _read_mention(text, clause, mention, mentions)
                if value is not None:
                    events.append((mention.start, value))
    return max(events)[1] if events else None


# A persuader sentence that asks for something: a question, a request to "you", an offer.
_REQUEST = _rx(
    r"\?|\byou\s+(?:\w+\s+)?(?:could|would|can|will|should|might|consider|want|like)\b",
    r"|\b(?:could|would|can|will)\s+you\b|\b(?:let's|how\s+about|what\s+about|please|why\s+not)\b",
)
# The persuader's own giving: "I'm going to match your .50 and donate $1".
_OWN_GIVING = _rx(r"\b(?:i|i'm|i'll|i've|i'd|we|we'll)\s+(?:(?!you\b)\w+\s+){0,3}?(?:donat\w*|gave|give|giving|match)\b")


def _own_giving(before: str) -> bool:
    """The persuader talks about its own gift, unless it then turns to the persuadee ("we cannot
    donate $5. Would you like to donate $1?")."""
    own = None
    for own in _OWN_GIVING.finditer(before):  # noqa: B007 (the last match is wanted)
        pass
    return own is not None and not re.search(r"\byou\b", before[own.end() :], re.I)


# One end of a range describing the choice: "from $0 to all your payment", "some or all of it".
_RANGE_START = _rx(r"\b(?:from|between|anywhere|any\s+amount)\b")
_RANGE_END = _rx(r"(?:\bto|\band|\bor|-|–)\s*$")
_RANGE_NEXT = _rx(r"\s*(?:to|or|-|–)\s*(?:\$|\.?\d|all\b|the\s+(?:whole|full|entire)\b|(?:a|one|two)\s+dollars?\b)")


def proposed_amount(text: str) -> float | None:
    """The last amount a persuader message asks for ("Would you give $1?", "How about 50 cents?").

    None when it asks for none. Not proposals: ranges describing the choice ("any amount from $0 to
    all your payment"), the payment itself, the persuader's own or past giving, statements that ask
    nothing ("a dollar goes a long way"), and any amount followed by a question without one (a
    "yes" would answer that question).
    """
    if not text:
        return None
    text = _normalize(text)
    mentions = [m for m in mentioned_amounts(text) if m.kind != "bare"]
    found = None
    for clause in _clauses(text):
        start = _sentence_start(text, clause.start)
        end = next((m.end() for m in _SENTENCE_END.finditer(text, clause.end)), len(text))
        inside = [m for m in mentions if clause.start <= m.start < clause.end]
        for mention in inside:
            left, right = text[clause.start : mention.start], text[mention.end : clause.end]
            before = text[start : mention.start]
            if _describes_payment(left, right) or _is_past(before) or _own_giving(before):
                continue
            if _RANGE_START.search(before) or _RANGE_END.search(before) or _RANGE_NEXT.match(right):
                continue
            if _REQUEST.search(text[start:end]):
                found = mention.value
        if found is not None and not inside and clause.asks:
            found = None
    return found


# A persuadee reply that accepts without naming an amount: "sure, I'll do that", "yes, that works".
_ACCEPTANCE = _rx(
    r"^\W*(?:yes|yeah|yep|yup|sure|ok|okay|alright|all\s+right|fine|deal|of\s+course|absolutely|definitely|",
    r"certainly|agreed|sounds\s+good|that\s+works|why\s+not)\b",
    r"|\b",
    _I,
    r"\s*(?:'ll|will|can|could|would|'d|am\s+willing\s+to|'m\s+willing\s+to)\s+",
    r"(?:be\s+(?:happy|glad)\s+to\s+|like\s+to\s+)?(?:do|donate|give|go\s+with|contribute|pay)\s+(?:that|it|this|so)\b",
    r"|\b(?:that|it|this)\s+(?:works|sounds\s+(?:good|fine|great|ok|okay)|is\s+(?:fine|ok|okay|good)|",
    r"(?:would|will)\s+be\s+(?:fine|ok|okay|good|great))\b",
)


def _accepts(text: str) -> bool:
    text = _normalize(text)
    return bool(_ACCEPTANCE.search(text)) and not _refusals(text)


def episode_donation(messages: Sequence[Message], accept_proposals: bool = False) -> float:
    """The episode's donation: the last amount a persuadee message states, clamped to [0, 2].

    0.0 when the persuadee never states one. With ``accept_proposals``, a persuadee message that
    accepts without an amount of its own ("sure, I'll do that") takes the amount the persuader
    proposed in the message right before it (:func:`proposed_amount`).
    """
    amount = None
    for i, message in enumerate(messages):
        if message.role != USER:
            continue
        value = parse_donation(message.content)
        if value is None and accept_proposals and i > 0 and messages[i - 1].role == AGENT:
            if _accepts(message.content):
                value = proposed_amount(messages[i - 1].content)
        if value is not None:
            amount = value
    return 0.0 if amount is None else min(max(amount, 0.0), PAYMENT)
