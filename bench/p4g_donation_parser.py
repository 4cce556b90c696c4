"""How well does the donation parser read the persuadees' intended donations in the P4G corpus?

On the 300 annotated dialogues, every persuadee with an annotated intended donation (``B5``) is
compared with ``episode_donation`` over the dialogue's messages, both clamped to the task's
[0, 2] range, to the cent. Printed: n, the exact-match rate, a zero / positive confusion table
(parsed vs annotated), the misses by cause and some example misses; then the same count with the
acceptance rule on (a persuadee "sure, I'll do that" takes the persuader's proposal).

Miss causes:
  (a) persuader only: the annotated amount appears only in the persuader's text;
  (b) nowhere: neither role's text mentions the annotated amount;
  (c) parser error: the persuadee's text contains the amount but the parser got it wrong.

Run: python bench/p4g_donation_parser.py [--data-dir DIR] [--examples 15]
The last line reads: RESULT exact=<fraction> n=<int> exact_with_acceptance=<fraction>
"""

from __future__ import annotations

import argparse
from collections import Counter

from scope_marl.core.types import Message
from scope_marl.envs.base import AGENT, USER
from scope_marl.envs.p4g.corpus import find_corpus_dir, read_dialogues, read_intended_donations
from scope_marl.envs.p4g.donation import PAYMENT, episode_donation, mentioned_amounts, parse_donation

CENT = 0.005  # half a cent: two amounts closer than this are the same to the cent


def clamp(x: float) -> float:
    return min(max(x, 0.0), PAYMENT)


def same(a: float, b: float) -> bool:
    return abs(a - b) < CENT - 1e-12


def mentions(message: Message, amount: float) -> bool:
    """Whether the message mentions ``amount`` (raw, as annotated). A $0 annotation is mentioned
    only by a persuadee message that refuses or states $0: the persuader's "from $0 to all your
    payment" quotes the choice, it does not propose nothing."""
    if amount == 0:
        return message.role == USER and parse_donation(message.content) == 0.0
    return any(same(x.value, amount) for x in mentioned_amounts(message.content))


def cause(messages: list[Message], annotated: float) -> str:
    """(c) the persuadee's text has the amount, (a) only the persuader's text has it, (b) neither."""
    if any(m.role == USER and mentions(m, annotated) for m in messages):
        return "c"
    if any(m.role == AGENT and mentions(m, annotated) for m in messages):
        return "a"
    return "b"


def relevant_message(messages: list[Message], annotated: float) -> str:
    """The persuadee message that mentions the annotated amount; else the persuadee's reply to the
    last persuader message that does; else the last one the parser read an amount from; else the
    last one."""
    for m in reversed(messages):
        if m.role == USER and mentions(m, annotated):
            return m.content
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == AGENT and mentions(messages[i], annotated):
            reply = next((m for m in messages[i + 1 :] if m.role == USER), None)
            if reply is not None:
                return reply.content
    users = [m.content for m in messages if m.role == USER]
    for text in reversed(users):
        if parse_donation(text) is not None:
            return text
    return users[-1] if users else ""


def score(dialogues: dict[str, list[Message]], intended: dict[str, float], accept: bool):
    rows = []
    for did in sorted(intended):
        if did not in dialogues:
            continue
        parsed = clamp(episode_donation(dialogues[did], accept_proposals=accept))
        rows.append((did, clamp(intended[did]), parsed))
    return rows


def report(rows, dialogues, intended, examples: int, title: str) -> float:
    n = len(rows)
    hits = sum(same(a, p) for _, a, p in rows)
    rate = hits / n if n else 0.0
    print(f"== {title}")
    print(f"n={n} exact={hits}/{n} = {rate:.3f}")
    table = Counter(("zero" if p == 0 else "positive", "zero" if a == 0 else "positive") for _, a, p in rows)
    print("confusion (rows: parsed, columns: annotated)")
    print(f"{'':>16}{'ann zero':>10}{'ann positive':>14}")
    for parsed_kind in ("zero", "positive"):
        print(f"{'parsed ' + parsed_kind:>16}{table[(parsed_kind, 'zero')]:>10}{table[(parsed_kind, 'positive')]:>14}")
    misses = [(did, a, p) for did, a, p in rows if not same(a, p)]
    causes = Counter(cause(dialogues[did], intended[did]) for did, _, _ in misses)
    print(f"misses={len(misses)}: (a) persuader only={causes['a']}  (b) nowhere={causes['b']}  (c) parser error={causes['c']}")
    if examples:
        print(f"example misses (up to {examples}; cause, dialogue, annotated, parsed, persuadee message):")
        order = {"c": 0, "a": 1, "b": 2}
        shown = sorted(misses, key=lambda r: order[cause(dialogues[r[0]], intended[r[0]])])[:examples]
        for did, a, p in shown:
            text = relevant_message(dialogues[did], intended[did]).replace("\n", " ")
            text = text if len(text) <= 140 else text[:137] + "..."
            print(f"  ({cause(dialogues[did], intended[did])}) {did}  ann={intended[did]:g} (={a:.2f})  parsed={p:.2f}  | {text}")
    return rate


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=None, help="corpus folder (default: find_corpus_dir())")
    parser.add_argument("--examples", type=int, default=15, help="example misses to print")
    args = parser.parse_args(argv)
    corpus = find_corpus_dir(args.data_dir)
    dialogues = read_dialogues(corpus, file="300_dialog.csv")
    intended = read_intended_donations(corpus)

    rows = score(dialogues, intended, accept=False)
    exact = report(rows, dialogues, intended, args.examples, "acceptance rule off")
    print()
    rows_acc = score(dialogues, intended, accept=True)
    exact_acc = report(rows_acc, dialogues, intended, args.examples, "acceptance rule on")
    print(f"RESULT exact={exact:.4f} n={len(rows)} exact_with_acceptance={exact_acc:.4f}")


if __name__ == "__main__":
    main()
