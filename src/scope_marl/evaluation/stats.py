"""Small statistics for evaluation tables: bootstrap and t-intervals, pass^k, and their table cells.

Everything here is a pure function of numbers, seeded where random, so evaluating twice gives the
same table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def bootstrap_ci(
    values: Sequence[float], confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0, groups: Sequence | None = None
) -> tuple[float, float]:
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


def pass_hat_k_intervals(per_task: Sequence[tuple[int, int]], seed: int = 0) -> dict[int, dict]:
    """pass^k for k = 1 .. the smallest sample count, each with a 95% bootstrap interval over tasks
    (pass^k is a mean over tasks of each task's own pass^k, so tasks are what is resampled)."""
    if not per_task:
        return {}
    k_max = min(n for _, n in per_task)
    return {k: mean_with_ci([pass_hat_k(c, n, k) for c, n in per_task], seed=seed) for k in range(1, k_max + 1)}


# Two-sided 95% Student-t quantiles by degrees of freedom (1..30); beyond, the normal 1.96.
_T975 = [
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
]


def t_interval(values: Sequence[float]) -> dict:
    """Mean and 95% Student-t interval, for a few independent runs (seeds): with so few values a
    t-interval is honest where a bootstrap would be too narrow. Same keys as :func:`mean_with_ci`."""
    values = [float(v) for v in values]
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return {"mean": mean, "low": mean, "high": mean, "n": n}
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = (_T975[n - 2] if n - 1 <= len(_T975) else 1.96) * sd / math.sqrt(n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n}


def format_interval(stat: dict | None, signed: bool = False) -> str:
    """A table cell for an interval dict: ``0.250 [0.000, 0.500]`` (``-`` when unmeasured); ``signed``
    for differences: ``+0.250 [-0.100, +0.600]``."""
    if not stat or stat.get("mean") is None:
        return "-"
    fmt = "{:+.3f}" if signed else "{:.3f}"
    return f"{fmt.format(stat['mean'])} [{fmt.format(stat['low'])}, {fmt.format(stat['high'])}]"


def format_number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
