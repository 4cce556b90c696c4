"""Linear layers with pre-packed weights for the sampler's forward passes on CPU.

Decoding multiplies a few dozen rows by each weight matrix. At that size torch's default CPU GEMM
re-packs the whole weight into its blocked layout on every call, which costs as much as the
multiplication: the LM head (49,152 x 576) at 46 rows ran at ~90 GFLOP/s where the same product
with the weight packed once by oneDNN runs at ~190 (``bench/packed_linear.py`` measures it here).
This is what ``torch.compile``'s CPU "freezing" does, without compiling anything.

Inside :class:`PackedModules` (a model's ``nn.Linear`` layers, what the sampler's steps use) or
:class:`PackedLinears` (a ``TorchFunctionMode``: every ``F.linear`` call), a float32 CPU linear (at
a row count where packing pays, below) uses a packed copy of its weight, made on first
use and remade whenever the weight changes
(its version counter moves: an optimizer step, a load), so a learner sharing the model never
samples from stale weights. Outside it nothing changes; the learner's forward and backward use
torch's own path. Packed copies cost one more copy of the weights' memory.

Which path is faster depends on the machine: on one CPU (GEMM ~170 GFLOP/s) packing ran the
model's linears 1.4-2x faster at 8-100 rows; on another (~400 GFLOP/s, a large cache) torch's own
path was faster at most row counts (packed 0.9x at 46 rows). So :meth:`PackedWeights.calibrate`
times, once per machine and model shape, all of the model's linear layers in order (as a forward
runs them, so weights stream as they do there) both ways at each row count of ``ROW_BUCKETS``, and
a call takes the packed path only at the row counts where that was faster
(``bench/packed_linear.py`` prints both and the choice). The choice is stored (``CHOICES_FILE``)
so that every process on the machine decides alike.
"""

from __future__ import annotations

import bisect
import fcntl
import functools
import hashlib
import json
import math
import time
import warnings
import weakref
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from scope_marl.core import files
from scope_marl.core.machine import cpu_model, scope_cache_dir

PACK_ROWS = 64  # oneDNN chooses its blocking for this many rows; any row count works
# Row counts the calibration times; a call follows the one nearest its rows (in ratio). Decoding
# steps carry from one row to a few hundred tokens.
ROW_BUCKETS = (1, 8, 64)

# The choices are stored per machine (CPU model, torch version, threads, the model's weight shapes)
# in this file under scope_cache_dir(), written under a lock: every process on the machine (a Ray
# actor, a torchrun rank, a resumed run) then takes the same path, so their samples stay
# bit-for-bit reproducible; timing alone could choose differently from one process to the next.
CHOICES_FILE = "packed_linear.json"
_MEASURED: dict[str, tuple[bool, ...]] = {}  # this process's copy of what it read or measured


_BOUNDS = [math.sqrt(a * b) for a, b in zip(ROW_BUCKETS, ROW_BUCKETS[1:])]  # midpoints in ratio


def row_bucket(rows: int) -> int:
    """Index in ROW_BUCKETS of the choice that a call with ``rows`` rows follows (the nearest in ratio)."""
    return bisect.bisect(_BOUNDS, rows)


def packing_available() -> bool:
    """Whether this torch build has oneDNN's packed linear (CPU builds on x86-64 and arm64 do)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedWeights:
    """Packed copies of weights, each remembered with the version it was packed at, and the row
    counts at which packing pays on this machine (after :meth:`calibrate`; ``always`` packs every
    call, for tests and benches)."""

    def __init__(self, always: bool = False) -> None:
        self._packs: dict[int, tuple[weakref.ref, int, torch.Tensor]] = {}
        self.always = always
        self.faster: tuple[bool, ...] | None = None  # per ROW_BUCKETS: the packed path measured faster

    @property
    def calibrated(self) -> bool:
        return self.always or self.faster is not None

    def use_packed(self, rows: int) -> bool:
        return self.always or (self.faster is not None and self.faster[row_bucket(rows)])

    @torch.no_grad()
    def calibrate(self, weights: Iterable[torch.Tensor]) -> None:
        """Time the linear layers of ``weights`` (a model's, in forward order) both ways at every
        row bucket, unless this machine has a stored choice for them (same CPU, torch, threads and
        shapes): then that choice is used."""
        weights = [w.detach() for w in weights if w.dtype == torch.float32 and w.device.type == "cpu" and w.dim() == 2]
        key = choice_key([tuple(w.shape) for w in weights], torch.get_num_threads())
        if key not in _MEASURED:
            _MEASURED[key] = _stored_choice(key, weights)
        self.faster = _MEASURED[key]

    def get(self, weight: torch.Tensor) -> torch.Tensor:
        entry = self._packs.get(id(weight))
        if entry is not None and entry[0]() is weight and entry[1] == weight._version:
            return entry[2]
        packed = _pack(weight.detach())
        key = id(weight)
        # The pack goes when its weight does (an evicted pool member's adapter, a replaced tensor).
        self._packs[key] = (weakref.ref(weight, lambda _: self._packs.pop(key, None)), weight._version, packed)
        return packed

    def clear(self) -> None:
        self._packs.clear()

    def __len__(self) -> int:
        return len(self._packs)


def _linear(weights: PackedWeights, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear``, on the packed weight where it is float32 on the CPU at a row count where packing pays."""
    if (
        x.dtype == weight.dtype == torch.float32
        and x.device.type == weight.device.type == "cpu"
        and x.dim() >= 2
        and weights.use_packed(x.numel() // x.shape[-1])
    ):
        return _packed_linear(x, weights.get(weight), bias)
    return F.linear(x, weight, bias)


class PackedLinears(TorchFunctionMode):
    """Inside this mode, every ``F.linear`` call goes through the packed routing (module docstring).
    The mode costs every torch call inside it a Python dispatch; a model's steps use :class:`PackedModules`."""

    def __init__(self, weights: PackedWeights):
        super().__init__()
        self.weights = weights

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            return _linear(self.weights, args[0], args[1], bias)
        return func(*args, **kwargs)


class PackedModules:
    """Inside this context, the ``nn.Linear`` layers of ``model`` go through the packed routing.

    Each layer's ``forward`` is shadowed by an instance attribute for the context's duration, so
    only the linears pay a Python check: the mode above costs every torch call of a decode step one
    (about 2,400 calls a step; a 32-episode rollout, alternating both ways in one process, ran 1-3%
    faster this way). Exactly ``nn.Linear`` (a subclass may compute something else). The layers and
    their routed forwards are found once, when this is made (a model's whole module tree takes
    milliseconds to walk), so a caller keeps one per model shape and makes a new one when
    adapters come or go. Leaving the context restores the modules as they were, so the model
    pickles and trains unchanged."""

    def __init__(self, weights: PackedWeights, model: torch.nn.Module):
        self.weights = weights
        linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
        self._routes = [(m.__dict__, functools.partial(self._forward, m)) for m in linears]

    def __enter__(self) -> PackedModules:
        for attributes, forward in self._routes:
            attributes["forward"] = forward
        return self

    def __exit__(self, *exc) -> None:
        for attributes, _ in self._routes:
            attributes.pop("forward", None)

    def _forward(self, module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return _linear(self.weights, x, module.weight, module.bias)


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's blocked copy of a ``[out, in]`` weight."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)


def _packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` on a packed weight (what the mode runs and what calibration times)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def choice_key(shapes: Iterable[tuple], threads: int) -> str:
    """What a stored choice is filed under: this CPU, torch's version, the thread count and the weights' shapes."""
    return (
        f"{cpu_model()} | torch {torch.__version__} | {threads} threads | "
        + hashlib.sha1(repr([tuple(s) for s in shapes]).encode()).hexdigest()[:16]
    )


def stored_choice(shapes: Iterable[tuple], threads: int) -> tuple[bool, ...] | None:
    """The choice this machine stored for linear weights of ``shapes`` (read only), or None when none is stored."""
    try:
        found = json.loads((scope_cache_dir() / CHOICES_FILE).read_text()).get(choice_key(shapes, threads))
    except (OSError, ValueError):
        return None
    return tuple(bool(v) for v in found) if isinstance(found, list) else None


def _stored_choice(key: str, weights: list[torch.Tensor]) -> tuple[bool, ...]:
    """The machine's stored choice for ``key``, measured and stored first if there is none (under
    a lock, so processes starting together measure once and agree)."""
    directory = scope_cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock = open(directory / (CHOICES_FILE + ".lock"), "a")
    except OSError as error:
        warnings.warn(
            f"cannot store the packed-weight choice under {directory} ({error}); measured for this process "
            "only, so another process may pick the other kernel and sample differently in the last bits. "
            "Fix: point $SCOPE_CACHE at a writable directory.",
            stacklevel=2,
        )
        return _packed_faster(weights)
    path = directory / CHOICES_FILE
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        try:
            table = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            table = {}  # none yet, or unreadable: this cache is measured again
        if key not in table or len(table[key]) != len(ROW_BUCKETS):
            table[key] = list(_packed_faster(weights))
            files.write_json(path, table)
        return tuple(bool(v) for v in table[key])


def _packed_faster(weights: list[torch.Tensor]) -> tuple[bool, ...]:
    """Per row bucket, whether the packed path ran ``weights`` faster than torch's, timed now: both
    warmed up, then three alternating rounds, the best of each (a first pass at a new size costs
    more on either path, and a lone slow round must not decide)."""
    packs = [_pack(w) for w in weights]  # timed only, not kept
    choice = []
    for rows in ROW_BUCKETS:
        inputs = [torch.randn(rows, w.shape[1]) for w in weights]
        paths = (
            lambda: [F.linear(x, w) for x, w in zip(inputs, weights)],  # noqa: B023 (called in this iteration)
            lambda: [_packed_linear(x, p, None) for x, p in zip(inputs, packs)],  # noqa: B023
        )
        best = [float("inf"), float("inf")]
        for round_ in range(4):
            for i, path in enumerate(paths):
                start = time.perf_counter()
                path()
                if round_:  # round 0 warms both up
                    best[i] = min(best[i], time.perf_counter() - start)
        choice.append(best[1] < best[0])
    return tuple(choice)
