"""Candidate replies for Verbalized Sampling (VS): parse them, draw one, measure their spread.

Why this module exists
----------------------
In VS the user simulator is asked, on each user turn, for ``k`` candidate replies in one JSON
object ``{"responses": [{"text": ..., "probability": ...}, ...]}``; one candidate is then drawn
in proportion to the stated probabilities (method ``prob``) or uniformly (method ``random``, whose
prompt asks for texts only). The simulators we can afford are small models, and small models
rarely write that object cleanly: code fences, prose around the JSON, trailing commas, single
quotes, percentages ("70%", or 30 meaning 30%), NaN, zero or missing probabilities, too few or too
many items, XML-ish tags instead of JSON, or output cut off at the token limit.

A rollout must not die on one malformed reply, and a silent mis-parse would bias exactly the
distribution VS exists to keep diverse. So :func:`parse_candidates` never raises, applies one
documented order of operations, and returns either a proper distribution (probabilities summing
to 1) or ``[]``, which callers treat as "no usable candidates" (re-ask, or fall back).

Only the standard library is used, so the parser can be imported anywhere (rollout workers,
metric scripts) without pulling in a model stack.
"""

from __future__ import annotations

import bisect
import html
import itertools
import json
import math
import operator
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Candidate", "candidate_entropy", "draw_candidate", "parse_candidates"]


@dataclass(frozen=True)
class Candidate:
    """One candidate reply and its probability (normalized by :func:`parse_candidates`)."""

    text: str
    probability: float


# --- limits --------------------------------------------------------------------------------------
# A reply with k candidates is a few kB. Anything far longer is runaway generation whose tail is
# no better than a cut-off reply, so it is truncated; this also bounds the parser's worst case.
MAX_INPUT_CHARS = 50_000
# Start positions ('{' or '[') that may fail to decode before the JSON scan gives up on a text.
_MAX_FAILED_STARTS = 200
# Single-quoted strings that may fail to close before the repair treats quotes as plain text.
_MAX_QUOTE_FAILURES = 50
# '[' positions tried when salvaging a list cut off mid-way.
_MAX_SALVAGE_STARTS = 50
# How deep wrappers such as {"output": {"responses": [...]}} are searched for the item list.
_MAX_WRAPPER_DEPTH = 6
# Stated numbers whose sum lies in this range are percentages (30 meaning 30%).
_PERCENT_SUM_RANGE = (50.0, 150.0)

# --- vocabulary ----------------------------------------------------------------------------------
# Keys (compared lower-cased) naming an item's text and its probability, in order of preference.
_TEXT_KEYS = ("text", "response", "reply", "content", "message", "utterance", "candidate")
_PROB_KEYS = ("probability", "prob", "p", "weight", "likelihood", "confidence")
# Keys of a wrapper object that hold the item list; searched before the wrapper's other values.
_LIST_KEYS = ("responses", "candidates", "replies", "options", "items", "answers")

_DECODER = json.JSONDecoder(strict=False)  # strict=False: models put raw newlines inside strings
_VALUE_START = re.compile(r"[\[{]")
_WHITESPACE = re.compile(r"\s*")
_FENCE = re.compile(r"```[A-Za-z0-9_+-]*[ \t]*\n?(.*?)(?:```|\Z)", re.S)
_NUMBER_TEXT = re.compile(r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*(%?)")
_NON_FINITE_TEXT = frozenset({"nan", "inf", "infinity"})

Method = Literal["prob", "random"]
# An item as collected: (text, raw probability). The text may be any JSON value and the raw
# probability anything at all (None when absent); both are judged later, in one place each.
_RawItem = tuple[Any, Any]


# =================================================================================================
# Public API
# =================================================================================================


def parse_candidates(text: str, k: int, method: Method) -> list[Candidate]:
    """Parse a simulator's VS output into at most ``k`` candidates whose probabilities sum to 1.

    Never raises: anything unusable yields ``[]``. Any number of usable items from 1 up is
    accepted; ``k`` only caps it.

    What is recognised (first match wins):

    1. JSON, searched inside code fences first and then in the whole text, so prose around it is
       ignored. The item list may be the top-level value, or sit under ``responses`` (or
       ``candidates``, ``replies``, ... or any key, at any depth up to a few wrappers). An item
       is an object with a text key (``text``, ``response``, ``reply``, ...) and optionally a
       probability key (``probability``, ``prob``, ``p``, ...), a plain string, or a
       ``[text, probability]`` pair. Bare item objects one after another (JSON Lines, or a list
       whose commas are missing) count as one list.
    2. The same after a string-aware repair: trailing commas dropped, single-quoted strings and
       unquoted keys quoted, Python's ``None``/``True``/``False``/``nan``/``inf`` translated,
       bare ``70%`` quoted.
    3. A list cut off mid-way (token limit): its complete leading elements.
    4. ``<response><text>..</text><probability>..</probability></response>`` tags.

    Order of operations on the collected items:

    1. drop items whose text is not a string or is empty after ``strip()`` (a text that is a
       number, list or null is not a reply);
    2. keep the first ``k``;
    3. ``random``: every kept item weighs 1, skip to step 8;
    4. read probabilities: numbers, numeric strings, ``"70%"`` (always a percentage); anything
       else (list, object, bool, null, words) counts as missing;
    5. if the kept items' stated numbers (as written, so "70%" adds 70) sum to 50..150, plain
       numbers are percentages too and are divided by 100;
    6. missing probabilities get the mean of the valid stated ones (finite and >= 0), or 1 if
       there are none; then NaN, infinities and negatives become 0;
    7. if every weight is 0, all become equal (uniform);
    8. merge duplicates (same text after collapsing whitespace): weights add up, the first
       occurrence's text is kept;
    9. renormalize to sum to 1.

    Texts are returned stripped of surrounding whitespace. A ``method`` other than ``"random"``
    is treated as ``"prob"``.
    """
    try:
        return _parse(text, k, method)
    except Exception:
        return []  # modes are handled where they occur, this catches only what was not foreseen


def draw_candidate(candidates: Sequence[Candidate], rng: random.Random) -> int:
    """Index of one candidate, drawn in proportion to the probabilities, using one ``rng.random()``.

    Raises ValueError on an empty list, and on probabilities that are negative, not finite, or
    all zero, since no distribution is defined then.
    """
    if not candidates:
        raise ValueError("cannot draw from an empty list of candidates")
    weights = [c.probability for c in candidates]
    if any(not math.isfinite(w) or w < 0 for w in weights):
        raise ValueError(f"probabilities must be finite and non-negative, got {weights}")
    cumulative = list(itertools.accumulate(weights))
    total = cumulative[-1]
    if not (total > 0 and math.isfinite(total)):
        raise ValueError(f"probabilities must have a positive finite sum, got {weights}")
    # bisect_right finds the first cumulative weight above u, so zero-weight items are never hit.
    index = bisect.bisect_right(cumulative, rng.random() * total)
    if index >= len(candidates):  # random() < 1, but the product can round up to the total
        index = max(i for i, w in enumerate(weights) if w > 0)
    return index


def candidate_entropy(candidates: Iterable[Candidate]) -> float:
    """Shannon entropy (natural log) of the stated distribution; 0.0 for no candidates.

    The weights are normalized first, so unnormalized lists work too; zero, negative and
    non-finite probabilities contribute nothing.
    """
    weights = [c.probability for c in candidates if math.isfinite(c.probability) and c.probability > 0]
    total = sum(weights)
    if not weights or not (total > 0 and math.isfinite(total)):
        return 0.0
    entropy = -sum((w / total) * math.log(w / total) for w in weights)
    return max(0.0, entropy)  # rounding can leave -0.0 or -1e-17 for a single candidate


# =================================================================================================
# From collected items to candidates (the order of operations documented above)
# =================================================================================================


def _parse(text: Any, k: Any, method: Any) -> list[Candidate]:
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    if not isinstance(text, str):
        return []
    try:
        k = operator.index(k)
    except TypeError:
        return []
    if k < 1:
        return []

    items = _collect_items(text[:MAX_INPUT_CHARS])
    usable = [(t.strip(), p) for t, p in items if isinstance(t, str) and t.strip()]
    kept = usable[:k]
    if not kept:
        return []
    texts = [t for t, _ in kept]
    weights = [1.0] * len(kept) if method == "random" else _weights([p for _, p in kept])
    return _merge_and_normalize(texts, weights)


def _weights(raw_probabilities: list[Any]) -> list[float]:
    """Non-negative finite weights, at least one positive, largest 1 (steps 4-7)."""
    read = [_read_probability(p) for p in raw_probabilities]
    values = _apply_percentages(read)
    valid = [v for v in values if v is not None and _is_valid(v)]
    # Dividing before adding keeps the mean finite even for values near the float maximum.
    fill = sum(v / len(valid) for v in valid) if valid else 1.0
    weights = [fill if v is None else (v if _is_valid(v) else 0.0) for v in values]
    largest = max(weights)
    if not largest > 0:
        return [1.0] * len(weights)
    # Scaling to a maximum of 1 keeps the sums in merging and renormalizing finite.
    return [w / largest for w in weights]


def _read_probability(raw: Any) -> tuple[float | None, bool]:
    """(number as written, whether it carried a % sign); (None, False) when nothing is stated."""
    if raw is None or isinstance(raw, bool):  # True is an int in Python, not a probability
        return None, False
    if isinstance(raw, int):
        try:
            return float(raw), False
        except OverflowError:  # a JSON integer with hundreds of digits
            return math.inf, False
    if isinstance(raw, float):
        return raw, False
    if isinstance(raw, str):
        stripped = raw.strip()
        match = _NUMBER_TEXT.fullmatch(stripped)
        if match:
            return float(match.group(1)), bool(match.group(2))
        if stripped.lower().lstrip("+-") in _NON_FINITE_TEXT:
            return float(stripped), False
    return None, False


def _apply_percentages(read: list[tuple[float | None, bool]]) -> list[float | None]:
    """Values as fractions: "70%" always; plain numbers when the written numbers sum to 50..150.

    The sum is taken over the numbers as written ("70%" adds 70), so a model that writes "70%"
    for one item and a bare 30 for the next is read as 0.7 and 0.3.
    """
    written = sum(v for v, _ in read if v is not None and _is_valid(v))
    low, high = _PERCENT_SUM_RANGE
    plain_are_percent = low <= written <= high
    return [None if v is None else (v / 100 if percent or plain_are_percent else v) for v, percent in read]


def _is_valid(value: float) -> bool:
    return math.isfinite(value) and value >= 0


def _merge_and_normalize(texts: list[str], weights: list[float]) -> list[Candidate]:
    """Steps 8-9: merge whitespace-insensitive duplicates (first text kept), then sum to 1."""
    merged: dict[str, list[Any]] = {}
    for text, weight in zip(texts, weights):
        key = " ".join(text.split())
        if key in merged:
            merged[key][1] += weight
        else:
            merged[key] = [text, weight]
    total = sum(weight for _, weight in merged.values())  # >= 1: the largest weight is 1
    return [Candidate(text, weight / total) for text, weight in merged.values()]


# =================================================================================================
# Collecting items from the raw text
# =================================================================================================


def _collect_items(text: str) -> list[_RawItem]:
    """Items from the first form that yields any: fenced JSON, JSON anywhere, then tags."""
    for segment in _segments(text):
        items = _items_from_json_text(segment)
        if items:
            return items
    return _items_from_tags(text)


def _segments(text: str) -> list[str]:
    """Contents of code fences (preferred: prose outside may hold stray brackets), then the text."""
    if "```" not in text:
        return [text]
    fenced = [m.group(1) for m in _FENCE.finditer(text) if m.group(1).strip()]
    return [*fenced, text]


def _items_from_json_text(text: str) -> list[_RawItem]:
    """Items of the text read as it is or after repair, whichever reading recovers more.

    Both are tried because the scan is lenient on its own: in a list with one trailing comma
    it still finds the intact items one by one, while the repair recovers them all. Ties go to
    the text as written (the repair leaves valid JSON unchanged, so they agree there).
    """
    items = _items_from_values(_json_values(text))
    repaired = _repair_json(text)
    if repaired != text:
        repaired_items = _items_from_values(_json_values(repaired))
        if len(repaired_items) > len(items):
            items = repaired_items
    if items:
        return items
    # Last resort for output cut off at the token limit: the complete elements of a cut-off list.
    # (Cut-off lists of objects are already recovered above, object by object.)
    return _items_from_values(_salvaged_lists(repaired))


def _json_values(text: str) -> Iterator[Any]:
    """Every top-level JSON value in ``text``, in order, skipping what does not decode.

    Each '{' or '[' is a possible start; after a failure the next one is tried, which is what
    finds JSON inside prose and the intact inner list of a broken outer object.
    """
    pos = 0
    failures = 0
    while failures < _MAX_FAILED_STARTS:
        match = _VALUE_START.search(text, pos)
        if match is None:
            return
        try:
            value, end = _DECODER.raw_decode(text, match.start())
        except (ValueError, RecursionError):  # ValueError covers JSONDecodeError and huge ints
            failures += 1
            pos = match.start() + 1
            continue
        yield value
        pos = end


def _items_from_values(values: Iterable[Any]) -> list[_RawItem]:
    """Items of the first value that holds any; consecutive bare item objects form one list."""
    loose: list[_RawItem] = []
    for value in values:
        if _is_item_object(value):
            loose.append(_item_from_object(value))
            continue
        if loose:  # a run of bare items has ended
            break
        items = _items_in(value, depth=0)
        if items:
            return items
    return loose


def _items_in(value: Any, depth: int) -> list[_RawItem]:
    """Items of a list, or of the item list found inside wrapper objects (depth-first)."""
    if depth > _MAX_WRAPPER_DEPTH:
        return []
    if isinstance(value, list):
        items = [item for item in map(_item_from_element, value) if item is not None]
        if items:
            return items
        children: list[Any] = value
    elif isinstance(value, dict):
        if _is_item_object(value):
            return [_item_from_object(value)]
        lowered = _lower_keys(value)
        preferred = [lowered[key] for key in _LIST_KEYS if key in lowered]
        children = preferred + [v for v in value.values() if not any(v is p for p in preferred)]
    else:
        return []
    for child in children:
        if isinstance(child, (list, dict)):
            items = _items_in(child, depth + 1)
            if items:
                return items
    return []


def _item_from_element(element: Any) -> _RawItem | None:
    """An element of an item list as an item, or None when it is not one."""
    if isinstance(element, str):
        return element, None
    if _is_item_object(element):
        return _item_from_object(element)
    # A [text, probability] pair; the number check keeps lists of plain words out.
    if isinstance(element, list) and len(element) == 2 and isinstance(element[0], str):
        if _read_probability(element[1])[0] is not None:
            return element[0], element[1]
    return None


def _is_item_object(value: Any) -> bool:
    """An object with a text key whose value is not a container (a container means a wrapper).

    A non-string scalar text (number, null) still makes an item, which is dropped later as
    unusable, so that a wrong type costs one item and not the whole list.
    """
    if not isinstance(value, dict):
        return False
    lowered = _lower_keys(value)
    return any(key in lowered and not isinstance(lowered[key], (list, dict)) for key in _TEXT_KEYS)


def _item_from_object(obj: dict) -> _RawItem:
    lowered = _lower_keys(obj)
    text = next(lowered[key] for key in _TEXT_KEYS if key in lowered and not isinstance(lowered[key], (list, dict)))
    probability = next((lowered[key] for key in _PROB_KEYS if key in lowered), None)
    return text, probability


def _lower_keys(obj: dict) -> dict[str, Any]:
    lowered: dict[str, Any] = {}
    for key, value in obj.items():
        lowered.setdefault(str(key).strip().lower(), value)  # first spelling wins
    return lowered


def _salvaged_lists(text: str) -> Iterator[list[Any]]:
    """For each '[' (in order), the elements that decode completely before the list breaks off."""
    pos = 0
    for _ in range(_MAX_SALVAGE_STARTS):
        start = text.find("[", pos)
        if start < 0:
            return
        yield _leading_elements(text, start + 1)
        pos = start + 1


def _leading_elements(text: str, pos: int) -> list[Any]:
    elements: list[Any] = []
    while True:
        pos = _WHITESPACE.match(text, pos).end()
        try:
            value, pos = _DECODER.raw_decode(text, pos)
        except (ValueError, RecursionError):
            return elements
        elements.append(value)
        pos = _WHITESPACE.match(text, pos).end()
        if not text.startswith(",", pos):
            return elements
        pos += 1


# =================================================================================================
# Repairing almost-JSON
# =================================================================================================

# One token of almost-JSON. Double-quoted strings are whole tokens, so nothing inside them is
# ever rewritten; a string cut off at the end of the text runs to the end.
_TOKEN = re.compile(
    r"""
      (?P<string>"[^"\\]*(?:\\.[^"\\]*)*"?)
    | (?P<comma>,(?=\s*[}\]]))
    | (?P<number>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?%?)
    | (?P<word>[A-Za-z_]\w*)
    | (?P<space>\s+)
    | (?P<other>.)
    """,
    re.X | re.S,
)
# A single-quoted string ends at a quote followed by what may follow a JSON string, so the
# apostrophe in 'I can't' stays inside it.
_SINGLE_QUOTED = re.compile(r"'((?:[^'\\]|\\.|'(?!\s*(?:[,:}\]]|\Z)))*)'(?=\s*(?:[,:}\]]|\Z))", re.S)
_SINGLE_QUOTED_ESCAPES = re.compile(r'\\.|"', re.S)
_COLON_AHEAD = re.compile(r"\s*:")
_PYTHON_LITERALS = {
    "None": "null",
    "True": "true",
    "False": "false",
    "nan": "NaN",
    "NaN": "NaN",
    "inf": "Infinity",
    "Inf": "Infinity",
    "infinity": "Infinity",
    "Infinity": "Infinity",
}
# Where JSON expects a value or a key: after these characters. Rewrites happen only there, so
# prose ("Here's", "about 70% sure", "None of these") passes through untouched.
_KEY_CONTEXT = "{,"
_VALUE_CONTEXT = ":[,"
_STRING_CONTEXT = "{[,:"


def _repair_json(text: str) -> str:
    """Almost-JSON made JSON, without touching the contents of double-quoted strings.

    Trailing commas are dropped; single-quoted strings, unquoted keys and bare ``70%`` are
    quoted; Python literals become JSON ones; ``.5`` and ``5.`` get their zero.
    """
    out: list[str] = []
    prev = ""  # last non-space character written: tells whether a key or value may start here
    pos = 0
    quote_failures = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        kind, token = match.lastgroup, match.group()
        pos = match.end()
        if kind == "comma":
            continue
        if kind == "number" and prev and prev in _VALUE_CONTEXT:
            token = _repair_number(token)
        elif kind == "word":
            if prev and prev in _KEY_CONTEXT and _COLON_AHEAD.match(text, pos):
                token = f'"{token}"'
            elif prev and prev in _VALUE_CONTEXT and token in _PYTHON_LITERALS:
                token = _PYTHON_LITERALS[token]
        elif token == "'" and prev and prev in _STRING_CONTEXT and quote_failures < _MAX_QUOTE_FAILURES:
            quoted = _SINGLE_QUOTED.match(text, pos - 1)
            if quoted:
                token = '"' + _SINGLE_QUOTED_ESCAPES.sub(_requote, quoted.group(1)) + '"'
                pos = quoted.end()
            else:
                quote_failures += 1  # bounds the cost of garbage full of quotes
        out.append(token)
        if kind != "space":
            prev = token[-1]
    return "".join(out)


def _requote(match: re.Match) -> str:
    """Escapes of a single-quoted string's content, made right for a double-quoted one."""
    token = match.group()
    if token == '"':
        return '\\"'
    if token == "\\'":
        return "'"
    return token


def _repair_number(token: str) -> str:
    percent = token.endswith("%")
    core = token.rstrip("%").lstrip("+")
    sign = "-" if core.startswith("-") else ""
    core = core.lstrip("-")
    if core.startswith("."):
        core = "0" + core
    if core.endswith("."):
        core += "0"
    core = sign + core
    return f'"{core}%"' if percent else core


# =================================================================================================
# XML-ish tags
# =================================================================================================

# Attribute runs are bounded so that text full of "<response" without ">" stays linear.
_OPEN_RESPONSE = re.compile(r"<response\b[^<>]{0,200}>", re.I)
_CLOSE_RESPONSE = re.compile(r"</response\s*>", re.I)
_TEXT_TAG = re.compile(r"<text\b[^<>]{0,200}>(.*?)</text\s*>", re.I | re.S)
_PROB_TAG = re.compile(r"<(probability|prob)\b[^<>]{0,200}>(.*?)</\1\s*>", re.I | re.S)


def _items_from_tags(text: str) -> list[_RawItem]:
    """Items from ``<response>`` blocks; only closed blocks count (a cut-off one is dropped)."""
    items: list[_RawItem] = []
    pos = 0
    while True:
        opening = _OPEN_RESPONSE.search(text, pos)
        if opening is None:
            break
        closing = _CLOSE_RESPONSE.search(text, opening.end())
        if closing is None:
            break
        body = text[opening.end() : closing.start()]
        # An unclosed <response> before this one: the item starts at the last opening.
        for inner in _OPEN_RESPONSE.finditer(body):
            body = body[inner.end() :]
        items.append(_item_from_tag_body(body))
        pos = closing.end()
    return items


def _item_from_tag_body(body: str) -> _RawItem:
    prob_tag = _PROB_TAG.search(body)
    probability = html.unescape(prob_tag.group(2)) if prob_tag else None
    text_tag = _TEXT_TAG.search(body)
    if text_tag:
        return html.unescape(text_tag.group(1)), probability
    # <response>text</response>, possibly with a probability tag beside the text.
    bare = _PROB_TAG.sub("", body)
    return (html.unescape(bare) if "<" not in bare else None), probability
