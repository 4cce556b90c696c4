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


# /proc/cpuinfo flags -> the vector / matrix units a figure is attributable to (x86 and Arm names).
_ISA_FLAGS = (
    ("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16"), ("avx512f", "AVX-512"), ("avx2", "AVX2"),
    ("sve", "SVE"), ("asimd", "NEON"),
)  # fmt: skip


def cpu_isa() -> str:
    """The CPU's vector and matrix extensions that matter for torch's kernels, widest first (``AVX2``,
    ``AVX-512+AMX-BF16``, ``NEON+SVE``; ``unknown`` where /proc/cpuinfo does not say)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    flags = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.split(":", 1)[1].split())
            break
    found = [name for flag, name in _ISA_FLAGS if flag in flags]
    return "+".join(found) if found else "unknown"


def cpu_slug() -> str:
    """:func:`cpu_model` as one token for a RESULT line (``AMD_EPYC_7B13``)."""
    return "_".join(cpu_model().replace("(R)", "").replace("(TM)", "").replace("@", " ").split()) or "unknown"


def machine_line(gflops: float | None = None) -> str:
    """One line naming the machine a figure comes from: CPU model, ISA, usable cores, fp32 GEMM."""
    gflops = gemm_gflops() if gflops is None else gflops
    return f"cpu: {cpu_model()} | isa: {cpu_isa()} | cores: {len(os.sched_getaffinity(0))} | fp32 GEMM {gflops:.1f} GFLOP/s"


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) CPU time of the whole machine since boot, in clock ticks (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _own_jiffies() -> int:
    """This process's CPU time (user + system, its threads included), in clock ticks."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


class ThreadGovernor:
    """Torch's thread count chosen from the cores this process may use and how many of them other
    processes keep busy, checked again at every :meth:`adjust` (between steps).

    Why: torch's default is one thread per core, and its threads spin while they wait for each other.
    Two such processes on the same cores collapse (a training step went from 45 s alone to 702 s beside
    an SFT run, whose own step went from 12 s to 80 s): every wait spins through the other process's
    time slice. A process that leaves the others' cores alone runs as if it had fewer cores: beside one
    busy process on two cores each gets one, about 2x slower, not 15x (``bench/contention.py``).

    ``fixed`` (a config's ``threads``) disables it: exactly that many threads, always.
    """

    def __init__(self, fixed: int | None = None, window_s: float = 0.2):
        self.fixed = fixed
        self.usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.window_s = window_s
        self._last: tuple[int, int, int] | None = None
        self._adjusted = 0.0
        self.others_busy = 0.0  # cores other processes kept busy over the last window

    def _sample(self) -> tuple[int, int, int]:
        busy, total = _cpu_jiffies()
        return busy, total, _own_jiffies()

    def choose(self) -> int:
        """The thread count for now: ``fixed``, else the usable cores less those others keep busy (at least 1)."""
        if self.fixed is not None:
            return self.fixed
        try:
            if self._last is None:  # nothing measured yet: watch the machine for a moment
                self._last = self._sample()
                time.sleep(self.window_s)
            now = self._sample()
        except (OSError, ValueError, IndexError):  # no /proc (not Linux): torch's default
            return self.usable
        busy, total, own = (b - a for a, b in zip(self._last, now))
        self._last = now
        cpus = os.cpu_count() or self.usable
        self.others_busy = max(0.0, (busy - own) / total * cpus) if total > 0 else 0.0
        return max(1, min(self.usable, self.usable - round(self.others_busy)))

    def adjust(self) -> int:
        """Set torch's thread count to :meth:`choose`'s; returns it."""
        import torch

        self._adjusted = time.monotonic()
        threads = self.choose()
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
        return threads

    def recheck(self, every_s: float = 2.0) -> None:
        """:meth:`adjust` again if the last check is older than ``every_s`` (cheap otherwise). Called
        inside long steps (the rollout engine between decode steps, the learner between micro-batches):
        a job that kept every core through a step of minutes beside a newly started one would still collapse."""
        if self.fixed is None and time.monotonic() - self._adjusted >= every_s:
            self.adjust()


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
