"""``hardware:``: where a run's models live and in which precision, and how torchrun ranks share a model.

``auto`` resolves once at start (``backends.placement.resolve_placement``): a CUDA GPU when torch sees one,
with bfloat16 weights; otherwise the CPU in float32 (today's numbers, bit for bit). The resolved
choice is printed at the start of every command that loads a model.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from scope_marl.config.loading import Section


class HardwareSettings(Section):
    """Device, precision and sharding of every model a run builds (agent, simulator, reference, judge)."""

    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda|cuda:\d+)$",
        description="auto (cuda when a GPU is there, else cpu), cpu, cuda or cuda:N; under torchrun, cuda means each rank's own GPU",
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="the weights' precision: auto is bfloat16 on a GPU and float32 on the CPU; LoRA weights, optimizer state, "
        "log-probs and the KL stay float32 either way",
    )
    parallel: Literal["replicate", "fsdp"] = Field(
        "replicate",
        description="torchrun ranks: replicate (every rank a whole copy, gradients summed; the small case) or fsdp "
        "(FSDP2 fully_shard: each rank holds a shard of the weights, gradients and optimizer state; bf16 compute, fp32 reduce)",
    )
