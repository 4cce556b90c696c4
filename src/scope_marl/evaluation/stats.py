"""Small statistics for evaluation tables: bootstrap intervals and pass^k.

Everything here is a pure function of numbers, seeded where random, so evaluating twice gives the
same table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def bootstrap_ci(values: Sequence[float], confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0,
                 groups: Sequence | None = None) -> tuple[float, float]:
    """Percentile bootstrap interval for the mean of ``values``.

    Resample with replacement ``n_resamples`` times, take each resample's mean, and return the
    (1 - confidence) / 2 and (1 + confidence) / 2 quantiles of those means. With ``groups`` (one
    key per value, e.g. the task), whole groups are resampled: several samples of one task are
    correlated, and resampling them one by one would make the interval too narrow. One value (or
    group) gives a zero-width interval; no values give (nan, nan).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    x = np.asarray(list(values), dtype=float)
    if x.size == 0:
        return (math.nan, math.nan)
    keys = list(groups) if groups is not None else list(range(x.size))
    if len(keys) != x.size:
        raise ValueError(f"{x.size} values but {len(keys)} group keys")
    index = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    which = np.array([index[k] for k in keys])
    sums, counts = np.bincount(which, weights=x), np.bincount(which).astype(float)
    if len(sums) == 1:
        mean = float(sums[0] / counts[0])
        return (mean, mean)
    rng = np.random.default_rng(seed & 0xFFFFFFFF)  # any int seed, negative ones included
    picks = rng.integers(0, len(sums), size=(n_resamples, len(sums)))
    means = sums[picks].sum(axis=1) / counts[picks].sum(axis=1)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return (float(low), float(high))


def mean_with_ci(values: Sequence[float], confidence: float = 0.95, seed: int = 0, groups: Sequence | None = None) -> dict:
    """``{"mean", "low", "high", "n"}`` for a table cell (None for no values); ``groups`` as in :func:`bootstrap_ci`."""
    values = [float(v) for v in values]
    if not values:
        return {"mean": None, "low": None, "high": None, "n": 0}
    low, high = bootstrap_ci(values, confidence, seed=seed, groups=groups)
    return {"mean": sum(values) / len(values), "low": low, "high": high, "n": len(values)}


def pass_hat_k(successes: int, samples: int, k: int) -> float:
    """pass^k for one task (tau-bench): the chance that k samples drawn without replacement from the
    task's n samples, c of which succeeded, ALL succeed: C(c, k) / C(n, k)."""
    if not 1 <= k <= samples:
        raise ValueError(f"k must be between 1 and the number of samples ({samples}), got {k}")
    if not 0 <= successes <= samples:
        raise ValueError(f"successes must be between 0 and {samples}, got {successes}")
    return math.comb(successes, k) / math.comb(samples, k)


def pass_hat_k_curve(per_task: Sequence[tuple[int, int]]) -> dict[int, float]:
    """Mean pass^k over tasks for k = 1 .. the smallest sample count; ``per_task`` is (c, n) pairs."""
    if not per_task:
        return {}
    k_max = min(n for _, n in per_task)
    return {k: sum(pass_hat_k(c, n, k) for c, n in per_task) / len(per_task) for k in range(1, k_max + 1)}


def format_interval(stat: dict | None) -> str:
    """A table cell for a ``mean_with_ci`` dict: ``0.250 [0.000, 0.500]`` (``-`` when unmeasured)."""
    if not stat or stat.get("mean") is None:
        return "-"
    return f"{stat['mean']:.3f} [{stat['low']:.3f}, {stat['high']:.3f}]"


def format_number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
