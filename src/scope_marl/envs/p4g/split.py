"""Deterministic train / validation / test split of P4G dialogues.

Each dialogue id gets a stable key (SHA-256 of the id, never Python's salted ``hash``). Within each
stratum (the persuadee donated something, or not) ids are ordered by key and cut at the cumulative
fractions, so the split is the same on every machine and run, stratified by outcome, and disjoint
by construction; :func:`check_disjoint` re-checks it whenever tasks are loaded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

SPLITS = ("train", "validation", "test")
DEFAULT_FRACTIONS = (0.8, 0.1, 0.1)


def stable_key(dialogue_id: str) -> str:
    return hashlib.sha256(dialogue_id.encode("utf-8")).hexdigest()


def split_ids(donated: Mapping[str, bool], fractions: tuple[float, float, float] = DEFAULT_FRACTIONS) -> dict[str, list[str]]:
    """Assign every id to a split, stratified by ``donated[id]``."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-9:
        raise ValueError(f"split fractions must be three non-negative numbers summing to 1, got {fractions}")
    out: dict[str, list[str]] = {name: [] for name in SPLITS}
    for stratum in (True, False):
        ids = sorted((i for i, d in donated.items() if d == stratum), key=stable_key)
        cut_train = round(len(ids) * fractions[0])
        cut_val = round(len(ids) * (fractions[0] + fractions[1]))
        out["train"] += ids[:cut_train]
        out["validation"] += ids[cut_train:cut_val]
        out["test"] += ids[cut_val:]
    for name in SPLITS:
        out[name].sort(key=stable_key)
    check_disjoint(out)
    return out


def check_disjoint(splits: Mapping[str, Iterable[str]]) -> None:
    """Raise if any id sits in two splits (a leak from training into evaluation)."""
    seen: dict[str, str] = {}
    for name, ids in splits.items():
        for i in ids:
            if i in seen:
                raise ValueError(f"dialogue {i} is in both the {seen[i]} and the {name} split; splits must be disjoint")
            seen[i] = name
