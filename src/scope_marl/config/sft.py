"""``scope sft`` configs: supervised fine-tuning of a user simulator on the corpus's human persuadee turns, or of
any role on a file of chat examples."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from scope_marl.config.env import P4GConfig
from scope_marl.config.hardware import HardwareSettings
from scope_marl.config.loading import Section
from scope_marl.config.train import THREADS, LoraSettings


class SFTConfig(Section):
    """``scope sft``: a simulator adapter (or a full copy) that writes the next human persuadee message."""

    model: str = Field("embedded", description="the base model the simulator adapter sits on (a local model spec)")
    env: P4GConfig = Field(
        default_factory=lambda: P4GConfig(name="p4g", source="corpus"),
        description="the P4G corpus (source: corpus): its train split is trained on, its validation split scored",
    )
    examples: str | None = Field(
        None,
        description="a JSONL file of chat examples to train on instead of the corpus: one object per line with context "
        "(a list of {role: system|user|assistant, content}), target (the reply to learn) and split (train | validation)",
    )
    merge: bool = Field(
        False,
        description="finetune: lora only: also export RUN_DIR/model, the base with the adapter merged into its weights "
        "(hf:RUN_DIR/model starts a later run from the fine-tuned policy, and its adapters-off policy is that one)",
    )
    finetune: Literal["lora", "full"] = Field("lora", description="a LoRA adapter, or every weight of its own copy")
    lora: LoraSettings = Field(default_factory=LoraSettings)
    lr: float = Field(2e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    batch_size: int = Field(8, ge=1, description="target turns per optimizer step")
    epochs: float = Field(1.0, gt=0, description="passes over the training turns (fractions allowed)")
    token_budget: int = Field(4096, ge=16, description="tokens per micro-batch (gradients accumulate across them)")
    all_turns: bool = Field(
        False, description="train on every persuadee turn, not only each dialogue's first env.max_exchanges (what rollouts reach)"
    )
    max_train_turns: int | None = Field(None, ge=1, description="use only the first N training turns of a seeded shuffle")
    max_val_turns: int = Field(200, ge=1, description="validation turns scored for the validation loss")
    eval_every: int = Field(50, ge=0, description="validation loss every N steps (and at the last; 0: only before and after)")
    checkpoint_every: int = Field(50, ge=1)
    keep_last: int = Field(2, ge=1)
    seed: int = 0
    threads: int | None = Field(None, ge=1, description=THREADS)
    hardware: HardwareSettings = Field(default_factory=HardwareSettings, description="device and precision")
