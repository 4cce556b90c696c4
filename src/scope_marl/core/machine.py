"""How fast this machine multiplies matrices: the one speed figure timings are quoted against.

CPU speeds differ several-fold between laptops (torch's fp32 GEMM runs at anything from about 70 to
340 GFLOP/s on two cores), so a time means little without it. ``scope demo`` measures it at its start
to estimate how long each part will take, and every bench script prints it beside its timings.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path


def scope_cache_dir() -> Path:
    """Where this machine's caches live (converted models, vLLM's venv, measured kernel choices):
    ``$SCOPE_CACHE``, else ``~/.cache/scope_marl``."""
    return Path(os.environ.get("SCOPE_CACHE") or Path.home() / ".cache" / "scope_marl")


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else the architecture."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


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


def last_level_cache_bytes(default: int = 32 * 2**20) -> int:
    """The largest CPU cache's size (Linux sysfs), or ``default`` where it cannot be read."""
    from pathlib import Path

    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip().upper()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=default)


def memory_read_gbps(buffer_bytes: int | None = None, repeats: int = 10, best_of: int = 3) -> float:
    """Memory read bandwidth in GB/s: a sum over an fp32 buffer at least 4x the last-level cache (so it
    streams from memory, not cache), on torch's current threads; the fastest of ``best_of`` rounds."""
    import torch

    size = buffer_bytes or 4 * last_level_cache_bytes()
    x = torch.ones(size // 4)
    x.sum()  # warm-up: pages touched, kernel picked
    best = float("inf")
    for _ in range(best_of):
        started = time.perf_counter()
        for _ in range(repeats):
            x.sum()
        best = min(best, time.perf_counter() - started)
    return x.numel() * 4 * repeats / best / 1e9
