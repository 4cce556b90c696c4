"""Atomic training checkpoints: everything needed to continue a run number for number.

What goes where is :mod:`scope_marl.core.run_layout` (shared with evaluation, which reads
checkpoints). A checkpoint is written into a temporary sibling folder, its files fsynced, the
folder renamed into place and the parent fsynced (:func:`scope_marl.core.files.atomic_directory`),
so a run killed mid-write leaves the previous checkpoint intact. ``manifest.json`` records the
size and SHA-256 of every file, so a resume can tell a damaged checkpoint (a disk that lost or
changed bytes) and fall back to an older one. The last ``keep_last`` are kept, plus the best.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path

import torch

from scope_marl.core import files, run_layout
from scope_marl.training import data_parallel

MANIFEST = "manifest.json"  # size and SHA-256 of every other file, written last


class CheckpointMismatch(ValueError):
    """A whole checkpoint that does not fit the run's models: a config changed, not a damaged disk."""


def save(
    run_dir: Path,
    step: int,
    chat,
    adapters: list[str],
    optimizers: dict,
    state: dict,
    engine_state: dict,
    weights: dict | None = None,
    sharded: dict | None = None,
) -> Path:
    """``weights`` maps a policy name to a fully fine-tuned model whose every weight is saved.

    ``sharded`` maps a policy name to ``(model, optimizer)`` of an FSDP2-sharded policy: each rank writes
    its own shards with ``torch.distributed.checkpoint`` into ``sharded/NAME`` (storage every rank can
    reach), so no rank ever holds the whole model or optimizer state, and a resume may use another
    number of ranks. With ``sharded`` every rank calls this; rank 0 alone writes everything else."""
    from safetensors.torch import save_model

    target = run_layout.checkpoint_dir(run_dir, step)
    if sharded and data_parallel.rank() != 0:
        _save_sharded(sharded, Path(data_parallel.broadcast(None)))  # into rank 0's temporary folder
        return target
    with files.atomic_directory(target) as tmp:
        if sharded:
            _save_sharded(sharded, Path(data_parallel.broadcast(str(tmp))))
        for name in adapters:
            chat.model.save_pretrained(tmp / "adapters", selected_adapters=[name])
        for name, model_chat in (weights or {}).items():
            (tmp / "weights").mkdir(exist_ok=True)
            save_model(model_chat.model, str(run_layout.weights_path(tmp, name)))  # handles tied embeddings
        torch.save({role: opt.state_dict() for role, opt in optimizers.items()}, tmp / "optimizers.pt")
        torch.save({"python": random.getstate(), "torch": torch.get_rng_state(), "engine": engine_state}, tmp / "rng.pt")
        (tmp / run_layout.STATE).write_text(json.dumps({"step": step, **state}, indent=2))
        manifest = {str(p.relative_to(tmp)): _fingerprint(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return target


def _save_sharded(sharded: dict, folder: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    for name, (model, optimizer) in sharded.items():
        model_state, optimizer_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=run_layout.sharded_path(folder, name))


def load_sharded(checkpoint: Path, sharded: dict) -> None:
    """Load what :func:`save` wrote for each sharded ``(model, optimizer)`` (every rank calls it,
    whatever the number of ranks that wrote it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    for name, (model, optimizer) in sharded.items():
        folder = run_layout.sharded_path(checkpoint, name)
        if not folder.is_dir():
            raise FileNotFoundError(
                f"{checkpoint} holds no sharded weights for {name!r} (it was written by an unsharded run); "
                "resume it with the hardware settings it was started with"
            )
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, checkpoint_id=folder)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def _fingerprint(path: Path) -> dict:
    with path.open("rb") as f:
        return {"size": path.stat().st_size, "sha256": hashlib.file_digest(f, "sha256").hexdigest()}


def problem(checkpoint: Path) -> str | None:
    """What is wrong with a checkpoint (a missing file, a size or content hash that differs from the
    manifest written at save time), or None when it is whole. Checkpoints written before manifests
    existed are checked by loading them instead."""
    path = checkpoint / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text())
    except ValueError as err:
        return f"{MANIFEST} is unreadable ({err})"
    for name, expected in manifest.items():
        file = checkpoint / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != expected["size"]:
            return f"{name} has {file.stat().st_size} bytes, {expected['size']} were written"
        if _fingerprint(file)["sha256"] != expected["sha256"]:
            return f"{name} differs from what was written (content hash)"
    return None


def load_state(checkpoint: Path) -> tuple[dict, dict, dict]:
    state = run_layout.read_state(checkpoint)
    optimizers = torch.load(checkpoint / "optimizers.pt", weights_only=False)
    rng = torch.load(checkpoint / "rng.pt", weights_only=False)
    return state, optimizers, rng


def load_newest(run_dir: Path, load, log, quarantine: bool = True, command: str = "scope train CONFIG --out NEW_DIR") -> Path:
    """Load the newest whole checkpoint of a run with ``load(path)``: a damaged one (a file missing or
    changed against its manifest; before manifests, one that does not load) is set aside with a warning
    (when ``quarantine``: one process of a run does it) and the next older one tried. A whole checkpoint
    that does not load is :class:`CheckpointMismatch`: the run's config changed, and setting it aside would
    lose a good checkpoint."""
    for path in reversed(run_layout.list_checkpoints(run_dir)):
        trouble = problem(path)
        if trouble is None:
            try:
                load(path)
                return path
            except Exception as err:
                if (path / MANIFEST).exists():  # whole, as written: the run's models differ from the ones that wrote it
                    raise CheckpointMismatch(
                        f"checkpoint {path} is whole (it matches its manifest) but does not load into the models of this run's "
                        f"config ({type(err).__name__}: {str(err)[:300]}); was config.yaml changed since the run started "
                        "(e.g. lora.r or model)? Put the setting back and resume, or start a new run with: " + command
                    ) from None
                trouble = f"it does not load ({type(err).__name__}: {err})"  # written before manifests: damage
        if quarantine:
            aside = set_aside(path)
            log(f"warning: checkpoint {path} is damaged ({trouble}); set aside as {aside.name}, using the previous one")
    raise FileNotFoundError(f"{run_dir} has no usable checkpoint; start it again with {command}")


def set_aside(checkpoint: Path) -> Path:
    """Rename a damaged checkpoint out of the run's list (kept for inspection, never loaded again)."""
    target = checkpoint.with_name(f"damaged-{checkpoint.name}")
    shutil.rmtree(target, ignore_errors=True)
    checkpoint.rename(target)
    return target


def restore_rng(rng: dict) -> None:
    random.setstate(rng["python"])
    torch.set_rng_state(rng["torch"])


def prune(run_dir: Path, keep_last: int, best: str | None) -> None:
    """Delete all but the last ``keep_last`` checkpoints and the one named ``best`` (a folder name)."""
    for path in run_layout.list_checkpoints(run_dir)[:-keep_last]:
        if path.name != best:
            shutil.rmtree(path)
