"""Derive the persona sampler's survey marginals from the P4G corpus.

Writes src/scope_marl/envs/p4g/persona_marginals.json: for each role and survey trait, the observed
values (numbers rounded to one decimal, ages to whole years) with their frequencies, a null value
standing for a missing cell; plus the share of persuadees who donated. No dialogue text and no
per-person record is stored, only counts per trait.

Run: python scripts/fit_p4g_marginals.py [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from scope_marl.envs.base import AGENT, USER
from scope_marl.envs.p4g.corpus import find_corpus_dir, read_participants
from scope_marl.envs.p4g.personas import CATEGORICAL, MARGINALS_FILE, NUMERIC


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args()
    corpus = find_corpus_dir(args.data_dir)
    participants = read_participants(corpus)
    roles = {}
    for role in (AGENT, USER):
        people = [d[role] for d in participants.values() if role in d]
        traits = {}
        for trait in NUMERIC + CATEGORICAL:
            counts: Counter = Counter()
            for p in people:
                value = p.survey.get(trait)
                if isinstance(value, float):
                    value = round(value) if trait in ("age", "income") else round(value, 1)
                counts[value] += 1
            ordered = sorted(counts.items(), key=lambda kv: (kv[0] is None, str(kv[0])))
            traits[trait] = {"values": [v for v, _ in ordered], "weights": [c for _, c in ordered]}
        roles[role] = traits
    persuadees = [d[USER] for d in participants.values() if USER in d]
    donated = sum(1 for p in persuadees if (p.donation or 0) > 0) / len(persuadees)
    out = {
        "source": "Persuasion for Good full_info.csv (Wang et al. 2019, Apache-2.0); counts per trait only",
        "participants": {role: sum(1 for d in participants.values() if role in d) for role in (AGENT, USER)},
        "persuadee_donation_rate": round(donated, 4),
        "roles": roles,
    }
    MARGINALS_FILE.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {MARGINALS_FILE} ({MARGINALS_FILE.stat().st_size} bytes); persuadee donation rate {donated:.3f}")


if __name__ == "__main__":
    main()
