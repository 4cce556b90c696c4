"""Verbalized Sampling candidates: lenient parsing, proportional draws, entropy.

The parser's contract (see ``scope_marl.simulators.candidates.parse_candidates``): never raise;
return [] or candidates whose probabilities sum to 1. Each case below pins one malformed (or
well-formed) output to its exact expected result, so a change of rule shows up as a named case.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest

from scope_marl.simulators.candidates import (
    Candidate,
    candidate_entropy,
    draw_candidate,
    parse_candidates,
)


def C(text: str, probability: float) -> Candidate:
    return Candidate(text, probability)


def vs_json(*items: tuple) -> str:
    """A canonical VS reply; an item is (text,) for no probability or (text, probability)."""
    rows = [{"text": it[0]} if len(it) == 1 else {"text": it[0], "probability": it[1]} for it in items]
    return json.dumps({"responses": rows})


def assert_candidates(got: list[Candidate], expected: list[Candidate]) -> None:
    assert all(isinstance(c, Candidate) for c in got)
    assert [c.text for c in got] == [c.text for c in expected]
    assert [c.probability for c in got] == pytest.approx([c.probability for c in expected], abs=1e-12)


CANONICAL = vs_json(("Yes, I'll donate $5.", 0.5), ("Not today, thanks.", 0.3), ("What is the charity?", 0.2))
CANONICAL_EXPECTED = [C("Yes, I'll donate $5.", 0.5), C("Not today, thanks.", 0.3), C("What is the charity?", 0.2)]

# (id, raw output, k, method, expected)
CASES = [
    # ---- well-formed ------------------------------------------------------------------------
    ("canonical", CANONICAL, 3, "prob", CANONICAL_EXPECTED),
    ("canonical_unnormalized", vs_json(("a", 0.4), ("b", 0.4), ("c", 0.4)), 3, "prob", [C("a", 1 / 3), C("b", 1 / 3), C("c", 1 / 3)]),
    ("random_texts_only", vs_json(("a",), ("b",), ("c",)), 3, "random", [C("a", 1 / 3), C("b", 1 / 3), C("c", 1 / 3)]),
    ("random_ignores_stated_probabilities", vs_json(("a", 0.9), ("b", 0.1)), 2, "random", [C("a", 0.5), C("b", 0.5)]),
    ("single_item", vs_json(("Only this.", 0.9)), 3, "prob", [C("Only this.", 1.0)]),
    (
        "top_level_list",
        json.dumps([{"text": "a", "probability": 0.25}, {"text": "b", "probability": 0.75}]),
        2,
        "prob",
        [C("a", 0.25), C("b", 0.75)],
    ),
    # ---- wrapping: fences, prose --------------------------------------------------------------
    ("json_fence_with_prose", f"Here you go:\n```json\n{CANONICAL}\n```\nHope that helps!", 3, "prob", CANONICAL_EXPECTED),
    ("bare_fence", f"```\n{CANONICAL}\n```", 3, "prob", CANONICAL_EXPECTED),
    (
        "fence_preferred_over_prose_items",
        'Draft: ["scratch"]\n```json\n' + vs_json(("a", 0.6), ("b", 0.4)) + "\n```",
        2,
        "prob",
        [C("a", 0.6), C("b", 0.4)],
    ),
    (
        "prose_around_with_stray_brackets",
        f"Here are [3] options {{as asked}}:\n{CANONICAL}\nLet me know [if] you need more.",
        3,
        "prob",
        CANONICAL_EXPECTED,
    ),
    # ---- syntax repairs ---------------------------------------------------------------------
    (
        "trailing_commas",
        '```json\n{"responses": [{"text": "a", "probability": 0.7,}, {"text": "b", "probability": 0.3},],}\n```',
        2,
        "prob",
        [C("a", 0.7), C("b", 0.3)],
    ),
    (
        "single_quotes_python_style",
        "{'responses': [{'text': 'Sure, why not', 'probability': 0.6}, {'text': 'I can't today', 'probability': 0.4}]}",
        2,
        "prob",
        [C("Sure, why not", 0.6), C("I can't today", 0.4)],
    ),
    (
        "python_none_is_missing",
        "{'responses': [{'text': 'a', 'probability': 0.2}, {'text': 'b', 'probability': None}]}",
        2,
        "prob",
        [C("a", 0.5), C("b", 0.5)],
    ),
    ("unquoted_keys", '{responses: [{text: "a", probability: 0.1}, {text: "b", probability: 0.9}]}', 2, "prob", [C("a", 0.1), C("b", 0.9)]),
    (
        "bare_percent_literals",
        '{"responses": [{"text": "a", "probability": 70%}, {"text": "b", "probability": 30%}]}',
        2,
        "prob",
        [C("a", 0.7), C("b", 0.3)],
    ),
    (
        "raw_newline_inside_string",
        '{"responses": [{"text": "Line one\nline two", "probability": 1}]}',
        1,
        "prob",
        [C("Line one\nline two", 1.0)],
    ),
    (
        "missing_commas_between_items",
        '{"responses": [{"text": "a", "probability": 0.5} {"text": "b", "probability": 0.3} {"text": "c", "probability": 0.2}]}',
        3,
        "prob",
        [C("a", 0.5), C("b", 0.3), C("c", 0.2)],
    ),
    ("json_lines", '{"text": "a", "probability": 0.6}\n{"text": "b", "probability": 0.4}\n', 2, "prob", [C("a", 0.6), C("b", 0.4)]),
    # ---- other shapes -----------------------------------------------------------------------
    (
        "plain_string_items_prob_method",
        '{"responses": ["a", "b", "c", "d"]}',
        4,
        "prob",
        [C("a", 0.25), C("b", 0.25), C("c", 0.25), C("d", 0.25)],
    ),
    (
        "candidates_key_and_item_key_variants",
        '{"candidates": [{"Response": "a", "Prob": 0.2}, {"reply": "b", "p": 0.8}]}',
        2,
        "prob",
        [C("a", 0.2), C("b", 0.8)],
    ),
    (
        "nested_wrapper_with_replies_key",
        '{"reasoning": "thinking", "output": {"replies": [{"text": "a", "weight": 3}, {"text": "b", "weight": 1}]}}',
        2,
        "prob",
        [C("a", 0.75), C("b", 0.25)],
    ),
    ("text_probability_pairs", '[["a", 0.7], ["b", "30%"]]', 2, "prob", [C("a", 0.7), C("b", 0.3)]),
    (
        "xml_tags",
        "Sure:\n<responses>\n<response><text>a</text><probability>0.6</probability></response>\n"
        "<response><text>b</text><probability>0.4</probability></response>\n</responses>",
        2,
        "prob",
        [C("a", 0.6), C("b", 0.4)],
    ),
    # "60%" and "20%" are percentages by their sign; b has none and gets their mean (0.4).
    (
        "xml_percent_missing_and_entity",
        "<response><text>a</text><probability>60%</probability></response>"
        "<response><text>b</text></response>"
        "<response><text>I &lt;3 it</text><probability>20%</probability></response>",
        3,
        "prob",
        [C("a", 0.5), C("b", 1 / 3), C("I <3 it", 1 / 6)],
    ),
    (
        "xml_bare_body_and_cut_off_last",
        "<response>Hello there</response><response>General</response><response>Ken",
        3,
        "prob",
        [C("Hello there", 0.5), C("General", 0.5)],
    ),
    # ---- probability values -----------------------------------------------------------------
    ("percent_strings", vs_json(("a", "70%"), ("b", "20%"), ("c", "10%")), 3, "prob", [C("a", 0.7), C("b", 0.2), C("c", 0.1)]),
    ("percent_numbers_sum_100", vs_json(("a", 60), ("b", 30), ("c", 10)), 3, "prob", [C("a", 0.6), C("b", 0.3), C("c", 0.1)]),
    ("percent_numbers_sum_90", vs_json(("a", 50), ("b", 30), ("c", 10)), 3, "prob", [C("a", 5 / 9), C("b", 3 / 9), C("c", 1 / 9)]),
    # Written numbers sum to 100 ("70%" counts as 70), so the bare 30 is a percentage too.
    ("mixed_percent_string_and_number", vs_json(("a", "70%"), ("b", 30)), 2, "prob", [C("a", 0.7), C("b", 0.3)]),
    ("numeric_strings", vs_json(("a", "0.7"), ("b", " 0.3 ")), 2, "prob", [C("a", 0.7), C("b", 0.3)]),
    (
        "nan_is_zero",
        '{"responses": [{"text": "a", "probability": NaN}, {"text": "b", "probability": 0.6}, {"text": "c", "probability": 0.4}]}',
        3,
        "prob",
        [C("a", 0.0), C("b", 0.6), C("c", 0.4)],
    ),
    ("nan_string_is_zero", vs_json(("a", "NaN"), ("b", "0.5")), 2, "prob", [C("a", 0.0), C("b", 1.0)]),
    (
        "infinity_is_zero",
        '{"responses": [{"text": "a", "probability": Infinity}, {"text": "b", "probability": 0.5}, {"text": "c", "probability": 0.5}]}',
        3,
        "prob",
        [C("a", 0.0), C("b", 0.5), C("c", 0.5)],
    ),
    (
        "huge_integer_is_infinite_so_zero",
        '{"responses": [{"text": "a", "probability": 1' + "0" * 400 + '}, {"text": "b", "probability": 1}]}',
        2,
        "prob",
        [C("a", 0.0), C("b", 1.0)],
    ),
    ("negative_is_zero", vs_json(("a", -0.5), ("b", 0.75), ("c", 0.25)), 3, "prob", [C("a", 0.0), C("b", 0.75), C("c", 0.25)]),
    ("zero_probability_kept", vs_json(("a", 0.8), ("b", 0), ("c", 0.2)), 3, "prob", [C("a", 0.8), C("b", 0.0), C("c", 0.2)]),
    ("all_zero_uniform", vs_json(("a", 0), ("b", 0.0), ("c", "0%")), 3, "prob", [C("a", 1 / 3), C("b", 1 / 3), C("c", 1 / 3)]),
    # b gets the mean of the stated 0.6 and 0.2, i.e. 0.4; then 0.6 : 0.4 : 0.2 is renormalized.
    ("missing_filled_with_mean", vs_json(("a", 0.6), ("b",), ("c", 0.2)), 3, "prob", [C("a", 0.5), C("b", 1 / 3), C("c", 1 / 6)]),
    ("none_stated_uniform", vs_json(("a",), ("b",), ("c",)), 3, "prob", [C("a", 1 / 3), C("b", 1 / 3), C("c", 1 / 3)]),
    # NaN is stated but invalid: it becomes 0 and is left out of the mean; with no valid number
    # stated, the missing one gets weight 1, so b takes all the mass.
    ("nan_and_missing", '{"responses": [{"text": "a", "probability": NaN}, {"text": "b"}]}', 2, "prob", [C("a", 0.0), C("b", 1.0)]),
    # ---- counts -----------------------------------------------------------------------------
    ("fewer_than_k", vs_json(("a", 0.6), ("b", 0.2)), 5, "prob", [C("a", 0.75), C("b", 0.25)]),
    ("more_than_k_first_k_kept", vs_json(("a", 0.1), ("b", 0.3), ("c", 0.4), ("d", 0.2)), 2, "prob", [C("a", 0.25), C("b", 0.75)]),
    ("duplicates_merged", vs_json(("Sure.", 0.4), ("No.", 0.2), ("Sure.", 0.4)), 3, "prob", [C("Sure.", 0.8), C("No.", 0.2)]),
    # Whitespace differences do not make a new reply; the first occurrence's text is kept (stripped).
    (
        "duplicates_whitespace_merged",
        vs_json((" Not  today. ", 0.3), ("Maybe.", 0.3), ("Not today.\n", 0.4)),
        3,
        "prob",
        [C("Not  today.", 0.7), C("Maybe.", 0.3)],
    ),
    # The first k are kept before merging, so two copies of "a" fill k=2.
    ("duplicates_after_first_k", vs_json(("a",), ("a",), ("b",)), 2, "random", [C("a", 1.0)]),
    # With `random` every listed slot is equally likely, so a repeated text carries two slots.
    ("random_duplicates_keep_their_slots", vs_json(("a",), ("b",), ("a",)), 3, "random", [C("a", 2 / 3), C("b", 1 / 3)]),
    # Empty texts are dropped before the first k are kept.
    (
        "empty_texts_dropped",
        vs_json(("", 0.5), ("   ", 0.2), ("a", 0.2), ("b", 0.1), ("c", 0.5)),
        2,
        "prob",
        [C("a", 2 / 3), C("b", 1 / 3)],
    ),
    # ---- wrong types ------------------------------------------------------------------------
    # A text that is not a string (42, null) is not a reply: that item is dropped, the rest kept.
    # A probability that is not a number (list, object, bool) counts as missing: it gets the mean
    # of the valid stated ones, here (0.2 + 0.4) / 2 = 0.3, so 0.3 : 0.2 : 0.3 : 0.4.
    (
        "wrong_types",
        json.dumps(
            {
                "responses": [
                    {"text": "a", "probability": [0.5]},
                    {"text": 42, "probability": 0.9},
                    {"text": "b", "probability": 0.2},
                    {"text": "c", "probability": {"value": 0.1}},
                    {"text": None, "probability": 0.5},
                    {"text": "d", "probability": 0.4},
                    {"text": "e", "probability": True},
                ]
            }
        ),
        4,
        "prob",
        [C("a", 0.25), C("b", 1 / 6), C("c", 0.25), C("d", 1 / 3)],
    ),
    # ---- cut off at the token limit ---------------------------------------------------------
    # Choice: complete items before the cut are recovered and renormalized; the partial item is
    # dropped (its text or probability may be incomplete).
    (
        "truncated_objects_recovered",
        '{"responses": [{"text": "a", "probability": 0.5}, {"text": "b", "probability": 0.3}, {"text": "c", "prob',
        3,
        "prob",
        [C("a", 0.625), C("b", 0.375)],
    ),
    ("truncated_strings_recovered", '{"responses": ["Yes.", "No.", "Mayb', 3, "random", [C("Yes.", 0.5), C("No.", 0.5)]),
    ("truncated_in_first_item", '{"responses": [{"text": "I would like to', 3, "prob", []),
    # ---- nothing usable ---------------------------------------------------------------------
    ("garbage", "I don't know what you mean. Could you say that again?", 3, "prob", []),
    ("empty_string", "", 3, "prob", []),
    ("whitespace_only", " \n\t ", 3, "prob", []),
    ("json_without_items", '{"responses": [], "note": {"count": 0}}', 3, "prob", []),
    ("only_empty_texts", vs_json(("", 0.5), (" ", 0.5)), 3, "prob", []),
]


@pytest.mark.parametrize(("raw", "k", "method", "expected"), [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_parse_cases(raw, k, method, expected):
    assert_candidates(parse_candidates(raw, k, method), expected)


def test_case_count():
    assert len(CASES) >= 30
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("bad_input", [None, 42, 3.5, ["a", "b"], {"responses": ["a"]}, object()])
def test_non_string_input_gives_empty(bad_input):
    assert parse_candidates(bad_input, 3, "prob") == []


def test_bytes_input_is_decoded():
    assert_candidates(parse_candidates(CANONICAL.encode(), 3, "prob"), CANONICAL_EXPECTED)


@pytest.mark.parametrize("bad_k", [0, -1, None, "3", 2.5])
def test_unusable_k_gives_empty(bad_k):
    assert parse_candidates(CANONICAL, bad_k, "prob") == []


def test_unknown_method_reads_probabilities():
    assert_candidates(parse_candidates(CANONICAL, 3, "weird"), CANONICAL_EXPECTED)


def test_huge_input_is_cut_not_fatal():
    padding = "blah " * 50_000
    assert_candidates(parse_candidates(CANONICAL + padding, 3, "prob"), CANONICAL_EXPECTED)
    assert parse_candidates(padding + CANONICAL, 3, "prob") == []  # beyond MAX_INPUT_CHARS
    assert parse_candidates("[" * 100_000, 3, "prob") == []
    assert parse_candidates("{'" * 100_000, 3, "prob") == []


# ---- property-style: never raises, always a distribution -------------------------------------

_ALPHABET = list("{}[]\"',:0123456789.-+%eE \n\t") + [
    "text",
    "probability",
    "responses",
    "NaN",
    "Infinity",
    "<response>",
    "</response>",
    "<text>",
    "</text>",
    "<probability>",
    "</probability>",
    "```",
    "json",
    "null",
    "true",
    "None",
    "\\",
    "\u00e9",
    "\ud800",
    "a",
    "b",
]
_SEEDS = [
    CANONICAL,
    vs_json(("a", "70%"), ("b",), ("a ", 30)),
    "{'responses': [{'text': 'x', 'probability': None},]}",
    "<response><text>a</text><probability>0.6</probability></response><response><text>b</text></response>",
    '[["a", 0.7], ["b", "30%"]]',
    '{"text": "a", "probability": 0.6}\n{"text": "b"}',
]


def _mutate(text: str, rng: random.Random) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 6)):
        op = rng.random()
        pos = rng.randint(0, len(chars))
        if op < 0.3 and chars:
            del chars[min(pos, len(chars) - 1)]
        elif op < 0.6:
            chars.insert(pos, rng.choice(_ALPHABET))
        elif op < 0.8 and chars:
            chars[min(pos, len(chars) - 1)] = rng.choice(_ALPHABET)
        else:
            chars = chars[:pos]  # cut off, as at a token limit
    return "".join(chars)


def _check_distribution(result, k):
    assert isinstance(result, list)
    if not result:
        return
    assert len(result) <= k
    probabilities = [c.probability for c in result]
    assert all(isinstance(c, Candidate) and isinstance(c.text, str) for c in result)
    assert all(c.text and c.text == c.text.strip() for c in result)
    assert len({" ".join(c.text.split()) for c in result}) == len(result)  # duplicates merged
    assert all(math.isfinite(p) and 0.0 <= p <= 1.0 for p in probabilities)
    assert sum(probabilities) == pytest.approx(1.0, abs=1e-9)


def test_never_raises_on_random_garbage_and_mutations():
    rng = random.Random(20240611)
    for i in range(3000):
        if i % 3 == 0:
            text = "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 120)))
        else:
            text = rng.choice(_SEEDS)
            for _ in range(rng.randint(1, 3)):
                text = _mutate(text, rng)
        k = rng.randint(1, 6)
        method = rng.choice(["prob", "random"])
        _check_distribution(parse_candidates(text, k, method), k)


def test_never_raises_on_wrong_json_types():
    rng = random.Random(7)
    values = [
        None,
        True,
        False,
        0,
        -1,
        1e308,
        -1e308,
        1e-320,
        10**30,
        "",
        " ",
        "70%",
        "x",
        [],
        [0.5],
        {},
        {"a": 1},
        [["nested"]],
        "NaN",
        "-inf",
        "1e999",
        3.5,
    ]
    for _ in range(2000):
        items = []
        for _ in range(rng.randint(0, 6)):
            item = {}
            if rng.random() < 0.9:
                item[rng.choice(["text", "response", "Text", "reply"])] = rng.choice(values + ["hi", "hi ", "yo"])
            if rng.random() < 0.8:
                item[rng.choice(["probability", "prob", "p"])] = rng.choice(values)
            items.append(rng.choice([item, rng.choice(values)]))
        wrapper = rng.choice([{"responses": items}, items, {"output": {"candidates": items}}, {"responses": rng.choice(values)}])
        text = json.dumps(wrapper, allow_nan=True)
        k = rng.randint(1, 6)
        _check_distribution(parse_candidates(text, k, rng.choice(["prob", "random"])), k)


# ---- Candidate ---------------------------------------------------------------------------------


def test_candidate_is_frozen_value_with_two_fields():
    assert [f.name for f in dataclasses.fields(Candidate)] == ["text", "probability"]
    c = Candidate("hi", 0.5)
    assert c == Candidate(text="hi", probability=0.5)
    assert c != Candidate("hi", 0.25)
    assert hash(c) == hash(Candidate("hi", 0.5))
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.text = "bye"  # type: ignore[misc]


# ---- drawing -----------------------------------------------------------------------------------

CRITICAL_CHI2_3DF_0999 = 16.27  # 0.999 quantile of chi-square with 3 degrees of freedom


def _chi_square(counts: list[int], probabilities: list[float]) -> float:
    n = sum(counts)
    return sum((observed - n * p) ** 2 / (n * p) for observed, p in zip(counts, probabilities))


def _draw_counts(probabilities: list[float], n: int, seed: int) -> list[int]:
    candidates = [Candidate(f"c{i}", p) for i, p in enumerate(probabilities)]
    rng = random.Random(seed)
    counts = [0] * len(candidates)
    for _ in range(n):
        counts[draw_candidate(candidates, rng)] += 1
    return counts


def test_draw_frequencies_match_stated_probabilities():
    stated = [0.5, 0.3, 0.15, 0.05]
    counts = _draw_counts(stated, 20_000, seed=1234)
    assert _chi_square(counts, stated) < CRITICAL_CHI2_3DF_0999


def test_chi_square_rejects_a_wrong_distribution():
    """The same statistic, on the same draws, rejects a distribution they were not drawn from:
    proof that the check above can fail."""
    counts = _draw_counts([0.5, 0.3, 0.15, 0.05], 20_000, seed=1234)
    assert _chi_square(counts, [0.25, 0.25, 0.25, 0.25]) > CRITICAL_CHI2_3DF_0999
    assert _chi_square(counts, [0.45, 0.3, 0.15, 0.1]) > CRITICAL_CHI2_3DF_0999  # even a near miss


def test_draw_is_reproducible_and_skips_zero_probability():
    candidates = [C("a", 0.0), C("b", 0.5), C("c", 0.0), C("d", 0.5), C("e", 0.0)]
    first = [draw_candidate(candidates, random.Random(5)) for _ in range(3)]
    assert len(set(first)) == 1
    rng = random.Random(9)
    assert {draw_candidate(candidates, rng) for _ in range(2000)} == {1, 3}


def test_draw_accepts_unnormalized_weights():
    counts = _draw_counts([5.0, 3.0, 1.5, 0.5], 20_000, seed=99)
    assert _chi_square(counts, [0.5, 0.3, 0.15, 0.05]) < CRITICAL_CHI2_3DF_0999


class _AlmostOne(random.Random):
    def random(self) -> float:
        return math.nextafter(1.0, 0.0)


def test_draw_at_top_of_range_lands_on_last_positive():
    assert draw_candidate([C("a", 0.5), C("b", 0.5), C("c", 0.0)], _AlmostOne()) == 1


@pytest.mark.parametrize("bad", [[], [C("a", 0.0)], [C("a", -0.5), C("b", 1.0)], [C("a", math.nan)], [C("a", math.inf)]])
def test_draw_rejects_empty_or_invalid(bad):
    with pytest.raises(ValueError):
        draw_candidate(bad, random.Random(0))


# ---- entropy -----------------------------------------------------------------------------------


def test_candidate_entropy():
    assert candidate_entropy([]) == 0.0
    assert candidate_entropy([C("a", 1.0)]) == 0.0
    assert candidate_entropy([C(str(i), 0.25) for i in range(4)]) == pytest.approx(math.log(4))
    assert candidate_entropy([C("a", 0.5), C("b", 0.5), C("z", 0.0)]) == pytest.approx(math.log(2))
    expected = -(0.7 * math.log(0.7) + 0.3 * math.log(0.3))
    assert candidate_entropy([C("a", 0.7), C("b", 0.3)]) == pytest.approx(expected)
    assert candidate_entropy([C("a", 7.0), C("b", 3.0)]) == pytest.approx(expected)  # normalized first


def test_entropy_of_parsed_candidates():
    parsed = parse_candidates(CANONICAL, 3, "prob")
    assert candidate_entropy(parsed) == pytest.approx(-sum(p * math.log(p) for p in (0.5, 0.3, 0.2)))
