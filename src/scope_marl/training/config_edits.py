"""What a resume may change in a run's ``config.yaml``.

A run's config is its ``config.yaml``, and each checkpoint keeps the config its step ran with (in its
``state.json``). When ``scope train --resume`` finds the two differ (the user edited ``config.yaml``),
each changed field is one of two kinds:

- **changeable**: how long, how often and where the run goes on, and the learners' step sizes. They
  are applied from the next step on (the optimizers' learning rate and weight decay are set from the
  config after their state is restored) and recorded in that step's metrics line as
  ``config_edits: {field: [old, new]}``;
- **everything else** (the models, LoRA shapes, the environment, the simulators, the loss, the
  rollout, seeds, hardware): the checkpoint's weights, optimizer state and data order were made
  under it, so changing it mid-run would silently train something else. Refused, naming each field
  with its old and new value, and the fix.
"""

from __future__ import annotations

from typing import Any

CHANGEABLE = (
    "steps",
    "checkpoint_every",
    "keep_last",
    "eval",
    "tensorboard",
    "logging",
    "rollout.progress",
    "threads",
    "executor",
    "ray",
    "learner.lr",
    "learner.weight_decay",
    "learner.max_grad_norm",
    "simulator_learner.lr",
    "simulator_learner.weight_decay",
    "simulator_learner.max_grad_norm",
)


class ConfigEditRefused(ValueError):
    """config.yaml was edited, before a resume, in a field a run cannot change mid-way."""


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


def changeable(field: str) -> bool:
    return any(field == c or field.startswith(c + ".") for c in CHANGEABLE)


def config_edits(saved: dict, current: dict) -> dict[str, list]:
    """Every field (dotted path) whose value differs between the two configs (JSON dumps): {field: [old, new]}."""
    old, new = _flat(saved), _flat(current)
    return {k: [old.get(k), new.get(k)] for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}


def check_edits(saved: dict | None, current: dict, step: int, run_dir: str) -> dict[str, list]:
    """The edits a resume applies (empty when none, or when the checkpoint predates config snapshots);
    ConfigEditRefused when any edit is of a field that cannot change mid-run."""
    if saved is None:
        return {}
    edits = config_edits(saved, current)
    refused = {k: v for k, v in edits.items() if not changeable(k)}
    if refused:
        listed = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
        raise ConfigEditRefused(
            f"{run_dir}/config.yaml was edited since step {step}'s checkpoint in field(s) a run cannot change mid-way ({listed}): "
            "the checkpoint was trained under the old values. Put them back, or start a new run with the new config: "
            f"scope train CONFIG --out NEW_DIR. Fields a resume may change: {', '.join(CHANGEABLE)}"
        )
    return edits
