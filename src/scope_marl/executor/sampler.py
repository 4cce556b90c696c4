"""Rollouts in this process on a sampler server (``sampler: vllm:MODEL@URL``) that receives the
learner's LoRA adapters through disk: a server loads adapters from folders, not from tensors."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from scope_marl.core import files, run_layout
from scope_marl.executor.base import LocalExecutor
from scope_marl.rollout.engine import RolloutEngine


class SamplerExecutor(LocalExecutor):
    """The engine here, its seats on the server; adapters pushed are saved under ``folder`` as
    ``NAME-vVERSION`` and loaded by the server under that version, which then drops the older one."""

    def __init__(self, engine: RolloutEngine, folder: str | Path):
        super().__init__(engine)
        self.folder = Path(folder)

    def push(self, source, names: Sequence[str], version: int, simulator_id: str | None = None) -> None:
        sampler = self.engine.agent.model
        for name in sorted(names):
            target = self.folder / f"{name}-v{version}"
            with files.atomic_directory(target) as tmp:
                source.model.save_pretrained(tmp, selected_adapters=[name])
            sampler.load_adapter(name, run_layout.adapter_path(target, name), version)
            for old in self.folder.glob(f"{name}-v*"):
                if old != target:
                    shutil.rmtree(old, ignore_errors=True)

    def describe(self) -> str:
        return "this process, sampling on the server"
