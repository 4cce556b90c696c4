"""Reply diversity of a frozen simulator with and without Verbalized Sampling, on the embedded model.

Same 20 Persuasion for Good dialogue states (the persuadee is about to answer), 10 replies per
state from (a) the plain frozen simulator, (b) VS prob and (c) VS random, k = 5, each of the 10 VS
replies from its own VS call (constrained JSON decoding, the default for local models).

Per condition: parse success rate and fallback rate (VS only), distinct-2 (unique word bigrams /
all bigrams, per state, averaged), share of unique first sentences (per state), top-1 reply mass
(share of the most common normalized first sentence, per state: 1.0 = fully collapsed), seconds.

Run: python bench/vs_diversity.py [--states 20] [--replies 10] [--k 5]
"""

from __future__ import annotations

import argparse
import re
import time
from collections import Counter

import torch

from scope_marl.backends.embedded import load_embedded
from scope_marl.core.types import Episode, Message, SamplingParams
from scope_marl.envs import USER, role_view
from scope_marl.envs.p4g.corpus import find_corpus_dir, read_dialogues
from scope_marl.envs.p4g.env import PersuasionForGood
from scope_marl.simulators import FrozenSimulator, SimulatorTurn
from scope_marl.simulators.verbalized import VerbalizedSampling, vs_metrics

OPENERS = [
    "Hi! Have you heard of Save the Children? They help kids in developing countries get food and school.",
    "Hello! Would you consider giving part of your task payment, say $1, to Save the Children?",
]


def dialogue_states(env: PersuasionForGood, n: int) -> list[tuple]:
    """(task, messages so far) pairs ending with a persuader message, from test-split dialogues."""
    tasks = env.tasks("test")[:n]
    corpus = find_corpus_dir(required=False)
    dialogues = read_dialogues(corpus) if corpus is not None and env.source == "corpus" else {}
    states = []
    for i, task in enumerate(tasks):
        messages = dialogues.get(task.task_id, [])
        # Up to the persuader's second message: past small talk, before any decision.
        agent_turns = [j for j, m in enumerate(messages) if m.role != USER]
        cut = agent_turns[1] + 1 if len(agent_turns) > 1 else 0
        states.append((task, messages[:cut] or [Message(role="agent", content=OPENERS[i % len(OPENERS)])]))
    return states


def first_sentence(text: str) -> str:
    head = re.split(r"(?<=[.!?])\s|\n", text.strip(), maxsplit=1)[0]
    return re.sub(r"[^a-z0-9 ]", "", head.lower()).strip()


def distinct_2(texts: list[str]) -> float:
    bigrams = [tuple(w[i : i + 2]) for w in (t.lower().split() for t in texts) for i in range(len(w) - 1)]
    return len(set(bigrams)) / len(bigrams) if bigrams else 0.0


def diversity(replies: list[list[str]]) -> dict:
    firsts = [[first_sentence(r) for r in rs] for rs in replies]
    return {
        "distinct2": sum(distinct_2(rs) for rs in replies) / len(replies),
        "unique_first": sum(len(set(f)) / len(f) for f in firsts) / len(firsts),
        "top1": sum(Counter(f).most_common(1)[0][1] / len(f) for f in firsts) / len(firsts),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--states", type=int, default=20)
    parser.add_argument("--replies", type=int, default=10)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=40, help="per reply (per candidate text under VS)")
    args = parser.parse_args()
    torch.manual_seed(0)

    chat = load_embedded()
    env = PersuasionForGood(source="auto", word_limit=30)
    states = dialogue_states(env, args.states)
    turns = [
        SimulatorTurn(
            f"s{i}-r{r}",
            task,
            role_view(messages, USER, env.system_prompt(task, USER)),
            rules=lambda text, task=task: env.normalize_user_reply(task, text),
        )
        for i, (task, messages) in enumerate(states)
        for r in range(args.replies)
    ]
    sampling = SamplingParams(temperature=0.7, top_p=0.95, max_new_tokens=args.max_new_tokens, seed=0)
    conditions = {
        "plain": FrozenSimulator(chat, sampling),
        "vs_prob": VerbalizedSampling(chat, k=args.k, method="prob", sampling=sampling, seed=0),
        "vs_random": VerbalizedSampling(chat, k=args.k, method="random", sampling=sampling, seed=0),
    }
    print(
        f"{len(states)} P4G states ({env.source} personas), {args.replies} replies each, k={args.k}, "
        f"T={sampling.temperature}, top_p={sampling.top_p}, <= {args.max_new_tokens} tokens per text"
    )
    print()
    header = f"{'condition':<11}{'parse ok':>9}{'fallback':>9}{'distinct-2':>11}{'unique 1st':>11}{'top-1 mass':>11}{'seconds':>9}"
    print(header)
    print("-" * len(header))
    results = {}
    example = {}
    for name, simulator in conditions.items():
        started = time.perf_counter()
        out = simulator.respond(turns)
        seconds = time.perf_counter() - started
        texts = [o.reply if hasattr(o, "reply") else o for o in out]
        per_state = [texts[i * args.replies : (i + 1) * args.replies] for i in range(len(states))]
        row = diversity(per_state)
        if hasattr(out[0], "info"):
            fake = [
                Episode(episode_id="x", task_id="x", group_id="x", simulator_id=name, metadata={"simulator_turns": [o.info for o in out]})
            ]
            m = vs_metrics(fake)
            row.update(parse_ok=m["parse_success_rate"], fallback=m["fallback_rate"])
        row["seconds"] = seconds
        results[name] = row
        example[name] = per_state[0][:3]
        parse_ok = "-" if name == "plain" else f"{row['parse_ok']:.3f}"
        fallback = "-" if name == "plain" else f"{row['fallback']:.3f}"
        print(
            f"{name:<11}{parse_ok:>9}{fallback:>9}{row['distinct2']:>11.3f}{row['unique_first']:>11.3f}{row['top1']:>11.3f}{seconds:>9.1f}"
        )
    print()
    for name, replies in example.items():
        print(f"{name}, state 0: " + " || ".join(r[:80].replace("\n", " ") for r in replies))
    print()
    vs = results["vs_prob"]
    print(
        f"RESULT plain_top1={results['plain']['top1']:.3f} vs_prob_top1={vs['top1']:.3f} vs_random_top1={results['vs_random']['top1']:.3f} "
        f"vs_parse_ok={(vs['parse_ok'] + results['vs_random']['parse_ok']) / 2:.3f} "
        f"vs_fallback={(vs['fallback'] + results['vs_random']['fallback']) / 2:.3f} "
        f"plain_distinct2={results['plain']['distinct2']:.3f} vs_prob_distinct2={vs['distinct2']:.3f}"
    )


if __name__ == "__main__":
    main()
