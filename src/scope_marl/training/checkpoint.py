"""Atomic training checkpoints: everything needed to continue a run number for number.

Layout (``docs/formats.md``)::

    RUN_DIR/checkpoints/step-000004/
        adapters/<name>/            peft adapter files, one folder per trained adapter
        weights/<name>.safetensors  full fine-tuning: every weight of that policy's model
        optimizers.pt               optimizer state per learner role
        state.json                  step, data cursor, best metric, pool root
        rng.pt                      python, torch RNG states and the engine's counters

A checkpoint is written into a temporary sibling folder and renamed into place, so a run killed
mid-write leaves the previous checkpoint intact. The last ``keep_last`` are kept, plus the best.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import torch

PREFIX = "step-"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"{PREFIX}{step:06d}"


def list_checkpoints(run_dir: Path) -> list[Path]:
    root = run_dir / "checkpoints"
    return sorted(p for p in root.glob(f"{PREFIX}*") if p.is_dir() and (p / "state.json").exists()) if root.exists() else []


def save(run_dir: Path, step: int, chat, adapters: list[str], optimizers: dict, state: dict, engine_state: dict,
         weights: dict | None = None) -> Path:
    """``weights`` maps a policy name to a fully fine-tuned model whose every weight is saved."""
    from safetensors.torch import save_model

    target = checkpoint_dir(run_dir, step)
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in adapters:
        chat.model.save_pretrained(tmp / "adapters", selected_adapters=[name])
    for name, model_chat in (weights or {}).items():
        (tmp / "weights").mkdir(exist_ok=True)
        save_model(model_chat.model, str(tmp / "weights" / f"{name}.safetensors"))  # handles tied embeddings
    torch.save({role: opt.state_dict() for role, opt in optimizers.items()}, tmp / "optimizers.pt")
    torch.save({"python": random.getstate(), "torch": torch.get_rng_state(), "engine": engine_state}, tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=2))
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


def adapter_path(folder: Path, name: str) -> Path:
    """Where ``save_pretrained(folder, selected_adapters=[name])`` put the adapter: peft writes a
    non-default adapter into a sub-folder named after it."""
    nested = folder / name
    return nested if nested.exists() else folder


def weights_path(checkpoint: Path, name: str) -> Path:
    return checkpoint / "weights" / f"{name}.safetensors"


def load_weights(chat, checkpoint: Path, name: str) -> None:
    """Restore a fully fine-tuned policy saved by :func:`save`."""
    from safetensors.torch import load_model

    load_model(chat.model, str(weights_path(checkpoint, name)))
    chat.prefix_cache.clear()


def load_state(checkpoint: Path) -> tuple[dict, dict, dict]:
    state = json.loads((checkpoint / "state.json").read_text())
    optimizers = torch.load(checkpoint / "optimizers.pt", weights_only=False)
    rng = torch.load(checkpoint / "rng.pt", weights_only=False)
    return state, optimizers, rng


def restore_rng(rng: dict) -> None:
    random.setstate(rng["python"])
    torch.set_rng_state(rng["torch"])


def prune(run_dir: Path, keep_last: int, best: str | None) -> None:
    """Delete all but the last ``keep_last`` checkpoints and the one named ``best`` (a folder name)."""
    for path in list_checkpoints(run_dir)[:-keep_last]:
        if path.name != best:
            shutil.rmtree(path)
