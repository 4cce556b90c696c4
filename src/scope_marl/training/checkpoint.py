"""Atomic training checkpoints: everything needed to continue a run number for number.

What goes where is :mod:`scope_marl.core.run_layout` (shared with evaluation, which reads
checkpoints). A checkpoint is written into a temporary sibling folder, fsynced and renamed into
place (:func:`scope_marl.core.files.atomic_directory`), so a run killed mid-write leaves the
previous checkpoint intact. The last ``keep_last`` are kept, plus the best.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import torch

from scope_marl.core import files, run_layout


def save(
    run_dir: Path, step: int, chat, adapters: list[str], optimizers: dict, state: dict, engine_state: dict, weights: dict | None = None
) -> Path:
    """``weights`` maps a policy name to a fully fine-tuned model whose every weight is saved."""
    from safetensors.torch import save_model

    target = run_layout.checkpoint_dir(run_dir, step)
    with files.atomic_directory(target) as tmp:
        for name in adapters:
            chat.model.save_pretrained(tmp / "adapters", selected_adapters=[name])
        for name, model_chat in (weights or {}).items():
            (tmp / "weights").mkdir(exist_ok=True)
            save_model(model_chat.model, str(run_layout.weights_path(tmp, name)))  # handles tied embeddings
        torch.save({role: opt.state_dict() for role, opt in optimizers.items()}, tmp / "optimizers.pt")
        torch.save({"python": random.getstate(), "torch": torch.get_rng_state(), "engine": engine_state}, tmp / "rng.pt")
        (tmp / run_layout.STATE).write_text(json.dumps({"step": step, **state}, indent=2))
    return target


def load_state(checkpoint: Path) -> tuple[dict, dict, dict]:
    state = run_layout.read_state(checkpoint)
    optimizers = torch.load(checkpoint / "optimizers.pt", weights_only=False)
    rng = torch.load(checkpoint / "rng.pt", weights_only=False)
    return state, optimizers, rng


def restore_rng(rng: dict) -> None:
    random.setstate(rng["python"])
    torch.set_rng_state(rng["torch"])


def prune(run_dir: Path, keep_last: int, best: str | None) -> None:
    """Delete all but the last ``keep_last`` checkpoints and the one named ``best`` (a folder name)."""
    for path in run_layout.list_checkpoints(run_dir)[:-keep_last]:
        if path.name != best:
            shutil.rmtree(path)
