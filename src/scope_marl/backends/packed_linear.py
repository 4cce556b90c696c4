"""Linear layers with pre-packed weights for the sampler's forward passes on CPU.

Decoding multiplies a few dozen rows by each weight matrix. At that size torch's default CPU GEMM
re-packs the whole weight into its blocked layout on every call, which costs as much as the
multiplication: the LM head (49,152 x 576) at 46 rows ran at ~90 GFLOP/s where the same product
with the weight packed once by oneDNN runs at ~190 (``bench/packed_linear.py`` measures it here).
This is what ``torch.compile``'s CPU "freezing" does, without compiling anything.

:class:`PackedLinears` is a ``TorchFunctionMode``: inside it, every ``F.linear`` on a float32 CPU
tensor uses a packed copy of its weight, made on first use and remade whenever the weight changes
(its version counter moves: an optimizer step, a load), so a learner sharing the model never
samples from stale weights. Outside it nothing changes; the learner's forward and backward use
torch's own path. Packed copies cost one more copy of the weights' memory.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

PACK_ROWS = 64  # oneDNN chooses its blocking for this many rows; any row count works


def packing_available() -> bool:
    """Whether this torch build has oneDNN's packed linear (CPU builds on x86-64 and arm64 do)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedWeights:
    """Packed copies of weights, each remembered with the version it was packed at."""

    def __init__(self) -> None:
        self._packs: dict[int, tuple[weakref.ref, int, torch.Tensor]] = {}

    def get(self, weight: torch.Tensor) -> torch.Tensor:
        entry = self._packs.get(id(weight))
        if entry is not None and entry[0]() is weight and entry[1] == weight._version:
            return entry[2]
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)
        key = id(weight)
        # The pack goes when its weight does (an evicted pool member's adapter, a replaced tensor).
        self._packs[key] = (weakref.ref(weight, lambda _: self._packs.pop(key, None)), weight._version, packed)
        return packed

    def clear(self) -> None:
        self._packs.clear()

    def __len__(self) -> int:
        return len(self._packs)


class PackedLinears(TorchFunctionMode):
    """Inside this mode, float32 CPU ``F.linear`` calls run on packed weights (module docstring)."""

    def __init__(self, weights: PackedWeights):
        super().__init__()
        self.weights = weights

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if x.dtype == weight.dtype == torch.float32 and x.device.type == weight.device.type == "cpu" and x.dim() >= 2:
                return torch.ops.mkldnn._linear_pointwise(x, self.weights.get(weight), bias, "none", [], "")
        return func(*args, **kwargs)
