"""Where a training run keeps what: the run-directory layout that training writes and evaluation reads.

A neutral module below both, so neither has to import the other to find a checkpoint::

    RUN_DIR/
        config.yaml                     the TrainConfig the run was started with
        metrics.jsonl                   one JSON line per step
        rollouts/episodes-NNNNN.jsonl   every rollout batch
        evals/step-NNNNNN.json          periodic evaluations
        pool/                           population co-training's simulator pool
        tensorboard/                    the optional TensorBoard mirror of metrics.jsonl
        report/                         with a tracker: the report (collapse.png, heldout.png) logged at the end
        wandb/  wandb-run.json          with the wandb tracker: W&B's own files; the W&B run id and last step surely written
        sampler-adapters/NAME-vSTEP/    with a sampler server: the adapter versions it loads
        checkpoints/step-NNNNNN/
            adapters/<name>/            peft adapter files, one folder per trained adapter
            weights/<name>.safetensors  full fine-tuning: every weight of that policy's model
            optimizers.pt  rng.pt       optimizer states; RNG states and the engine's counters
            state.json                  step, data cursor, best checkpoint, pool root

``docs/formats.md`` documents each file.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
ROLLOUTS = "rollouts"
EVALS = "evals"
POOL = "pool"
TENSORBOARD = "tensorboard"
WANDB_RUN = "wandb-run.json"
REPORT = "report"
SAMPLER_ADAPTERS = "sampler-adapters"
CHECKPOINTS = "checkpoints"
PREFIX = "step-"
STATE = "state.json"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"{PREFIX}{step:06d}"


def eval_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / EVALS / f"{PREFIX}{step:06d}.json"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints (with their state file), oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    return sorted(p for p in root.glob(f"{PREFIX}*") if p.is_dir() and (p / STATE).exists()) if root.exists() else []


HOLD_TRIES = 5


def hold_checkpoint(path: Path, dest: Path) -> tuple[Path, Path]:
    """The checkpoint ``path`` names (itself, or a run directory's best, else newest), held at
    ``dest/<its name>`` so a run still training cannot prune it mid-read: its files hard-linked there
    (a pruned checkpoint's files live on through the links; a copy where the filesystem refuses links).
    A checkpoint pruned between choosing and holding it is chosen again (the run's newer one).
    Returns (the checkpoint chosen, the held folder)."""
    for attempt in range(HOLD_TRIES):
        chosen = None
        try:
            chosen = resolve_checkpoint(path)
            held = Path(dest) / chosen.name
            shutil.copytree(chosen, held, copy_function=_link_or_copy)
            read_state(held)  # the copy is whole: its state file came along
            return chosen, held
        except (FileNotFoundError, shutil.Error):  # copytree gathers a vanished file's error into shutil.Error
            pruned = (chosen is not None and not chosen.exists()) or (chosen is None and bool(list_checkpoints(path)))
            if not pruned or attempt == HOLD_TRIES - 1:
                raise
            if chosen is not None:
                shutil.rmtree(Path(dest) / chosen.name, ignore_errors=True)
    raise AssertionError("unreachable")


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or links not allowed: copy
        shutil.copy2(src, dst)


def read_state(checkpoint: Path) -> dict:
    return json.loads((Path(checkpoint) / STATE).read_text())


def adapter_path(folder: Path, name: str) -> Path:
    """Where ``save_pretrained(folder, selected_adapters=[name])`` put the adapter: peft writes a
    non-default adapter into a sub-folder named after it."""
    nested = Path(folder) / name
    return nested if nested.exists() else Path(folder)


def saved_adapter(checkpoint: Path, name: str) -> Path:
    """The folder of adapter ``name`` inside a checkpoint."""
    return adapter_path(Path(checkpoint) / "adapters", name)


def weights_path(checkpoint: Path, name: str) -> Path:
    return Path(checkpoint) / "weights" / f"{name}.safetensors"


def sharded_path(checkpoint: Path, name: str) -> Path:
    """A sharded policy's weights and optimizer state (torch.distributed.checkpoint, one file per rank)."""
    return Path(checkpoint) / "sharded" / name


def run_dir_of(checkpoint: Path) -> Path:
    return Path(checkpoint).parent.parent


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint directory: ``path`` itself, or a run directory's best checkpoint (else its last)."""
    path = Path(path)
    if (path / STATE).exists():
        return path
    checkpoints = list_checkpoints(path)
    if not checkpoints:
        raise FileNotFoundError(
            f"{path} is neither a checkpoint directory (with {STATE}) nor a run directory with {CHECKPOINTS}/; "
            "pass RUN_DIR, RUN_DIR/checkpoints/step-NNNNNN, or base"
        )
    best = read_state(checkpoints[-1]).get("best")
    if best:
        named = path / CHECKPOINTS / Path(best[1]).name  # a name (older runs: a path; its name is the same)
        if (named / STATE).exists():
            return named
    return checkpoints[-1]
