"""Small statistics for evaluation tables: bootstrap intervals and pass^k.

Everything here is a pure function of numbers, seeded where random, so evaluating twice gives the
same table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def bootstrap_ci(values: Sequence[float], confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval for the mean of ``values``.

    Resample the values with replacement ``n_resamples`` times, take each resample's mean, and
    return the (1 - confidence) / 2 and (1 + confidence) / 2 quantiles of those means. One value
    gives a zero-width interval; no values give (nan, nan).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    x = np.asarray(list(values), dtype=float)
    if x.size == 0:
        return (math.nan, math.nan)
    if x.size == 1:
        return (float(x[0]), float(x[0]))
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_resamples, x.size))].mean(axis=1)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return (float(low), float(high))


def mean_with_ci(values: Sequence[float], confidence: float = 0.95, seed: int = 0) -> dict:
    """``{"mean", "low", "high", "n"}`` for a table cell (None for no values)."""
    values = [float(v) for v in values]
    if not values:
        return {"mean": None, "low": None, "high": None, "n": 0}
    low, high = bootstrap_ci(values, confidence, seed=seed)
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
