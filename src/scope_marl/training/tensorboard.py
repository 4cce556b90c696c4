"""Optional TensorBoard mirror of ``metrics.jsonl``: every numeric field of a step's line, as a scalar.

The JSONL file stays the source of truth (resume truncates it, reports read it); TensorBoard is a
view for people who already watch their runs there. Nested keys become tag paths, e.g.
``train_agent/kl`` or ``eval/heldout/reward/mean``.
"""

from __future__ import annotations

import math
from pathlib import Path


def flatten(record: dict, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a nested dict as ``{"a/b/c": value}`` (booleans, strings and None dropped)."""
    out: dict[str, float] = {}
    for key, value in record.items():
        tag = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, tag + "/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[tag] = float(value)
    return out


class TensorBoardWriter:
    wants_figures = False  # its scalars draw the same curves

    def __init__(self, log_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ImportError(
                "tensorboard: true needs the tensorboard package; install it with pip install 'scope-marl[tensorboard]' "
                "(or set tensorboard: false)"
            ) from None
        self._make = lambda first_step: SummaryWriter(log_dir=str(log_dir), purge_step=first_step)
        self.writer = None

    def log_step(self, record: dict) -> None:
        step = record["step"]
        if self.writer is None:
            # Opened at the first step written: after a resume, TensorBoard drops the events the
            # killed run wrote past the checkpoint (they are played again), as metrics.jsonl does.
            self.writer = self._make(step)
        for tag, value in flatten({k: v for k, v in record.items() if k != "step"}).items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()

    def log_samples(self, step: int, episodes) -> None:
        """Dialogues are not mirrored to TensorBoard (rollouts/ has every one)."""

    def log_figures(self, step: int, figures) -> None:
        """Not called (``wants_figures`` is False)."""

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
