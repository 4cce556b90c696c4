"""How fast this machine multiplies matrices: the one speed figure timings are quoted against.

CPU speeds differ several-fold between laptops (torch's fp32 GEMM runs at anything from about 70 to
340 GFLOP/s on two cores), so a time means little without it. ``scope demo`` measures it at its start
to estimate how long each part will take, and every bench script prints it beside its timings.
"""

from __future__ import annotations

import time


def gemm_gflops(size: int = 2048, repeats: int = 10, best_of: int = 1) -> float:
    """fp32 ``size`` x ``size`` matrix products per second, in GFLOP/s, on torch's current threads.

    ``best_of`` > 1 times that many rounds of ``repeats`` products and keeps the fastest: a short
    measurement is otherwise pulled down by whatever else the machine does for a moment."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # warm-up: the first product allocates and picks its kernel
    best = float("inf")
    for _ in range(best_of):
        started = time.perf_counter()
        for _ in range(repeats):
            a @ b
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 * repeats / best / 1e9
