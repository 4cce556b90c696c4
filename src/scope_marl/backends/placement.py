"""Where a model lives and in which precision: the ``hardware:`` section resolved against this machine.

Every local model a run builds is loaded through one :class:`Placement`, so the agent, the simulator,
the KL reference and a judge always share a device and a dtype. ``auto`` takes a CUDA GPU with
bfloat16 weights when torch sees one and the CPU with float32 otherwise; on the CPU that is exactly
the precision every earlier release ran in, so CPU numbers do not move.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from scope_marl.backends.base import BackendError
from scope_marl.config.hardware import HardwareSettings

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Placement:
    device: torch.device
    dtype: torch.dtype

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def describe(self) -> str:
        """One line for the start of a run: the device (with the GPU's name) and the dtype."""
        where = str(self.device)
        if self.on_gpu:
            where += f" ({torch.cuda.get_device_name(self.device)})"
        return f"hardware: {where}, {str(self.dtype).removeprefix('torch.')}"


CPU = Placement(torch.device("cpu"), torch.float32)


def resolve_placement(settings: HardwareSettings | None = None) -> Placement:
    """The placement ``settings`` asks for on this machine; an unusable request is a :class:`BackendError`
    that says what to change (never a silent fall back to the CPU)."""
    settings = settings or HardwareSettings()
    want = settings.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want.startswith("cuda"):
        if not torch.cuda.is_available():
            raise BackendError(
                f"hardware.device is {settings.device!r} but torch {torch.__version__} sees no CUDA GPU "
                f"(built for CUDA: {torch.version.cuda or 'no'}); use device: cpu (or auto), or install a CUDA build of torch"
            )
        index = int(want.partition(":")[2] or os.environ.get("LOCAL_RANK", torch.cuda.current_device()))
        if index >= torch.cuda.device_count():
            raise BackendError(
                f"hardware.device is {want!r} but this machine has {torch.cuda.device_count()} GPU(s) (cuda:0 .. "
                f"cuda:{torch.cuda.device_count() - 1}); name one of them, or use device: cuda"
            )
        device = torch.device("cuda", index)
    else:
        device = torch.device("cpu")
    dtype_name = settings.dtype if settings.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    if dtype_name == "bfloat16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise BackendError(f"{torch.cuda.get_device_name(device)} has no bfloat16 support; set hardware.dtype: float32")
    return Placement(device, DTYPES[dtype_name])
