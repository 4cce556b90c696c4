"""Trackers: where a run's metrics are mirrored for people to watch (TensorBoard, Weights & Biases).

``metrics.jsonl`` is the run's record (resume truncates it, reports read it); a tracker is a view of
it, chosen by name in ``logging.trackers`` and looked up in :data:`TRACKERS`. Each gets every step's
metrics line, a few of the step's dialogues, and the run's figures once it has trained its last step.

A tracker whose package is missing is an error when the run starts (naming the extra to install).
One that fails later or cannot start (a bad API key, a full disk) costs a warning, never a training
step: :class:`Trackers` catches the error, says which tracker stopped and why, and trains on
without it.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from scope_marl.config.train import TrainConfig
from scope_marl.core.registry import Registry
from scope_marl.core.types import Episode


class Tracker(Protocol):
    wants_figures: bool  # whether log_figures does anything (the figures are only drawn for one that does)

    def log_step(self, record: dict) -> None:
        """One step's metrics line (``record["step"]`` is the step)."""

    def log_samples(self, step: int, episodes: Sequence[Episode]) -> None:
        """A few of the step's dialogues."""

    def log_figures(self, step: int, figures: Sequence[Path]) -> None:
        """The run's figures (PNG files), once its last step is trained."""

    def close(self) -> None: ...


TRACKERS: Registry[Callable[[TrainConfig, Path, Callable[[str], None]], Tracker]] = Registry(
    "tracker", "@TRACKERS.register in scope_marl/training/trackers.py"
)


@TRACKERS.register("tensorboard")
def _tensorboard(cfg: TrainConfig, run_dir: Path, say: Callable[[str], None]) -> Tracker:
    from scope_marl.core import run_layout
    from scope_marl.training.tensorboard import TensorBoardWriter

    return TensorBoardWriter(run_dir / run_layout.TENSORBOARD)


@TRACKERS.register("wandb")
def _wandb(cfg: TrainConfig, run_dir: Path, say: Callable[[str], None]) -> Tracker:
    from scope_marl.training.wandb_tracker import WandbTracker

    return WandbTracker(cfg, run_dir, say)


def warn(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Trackers:
    """Every tracker the config names, called together; one that raises is dropped with a warning.
    ``enabled`` False (a data-parallel rank other than the lead, which writes nothing): none."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, say: Callable[[str], None] = warn, enabled: bool = True):
        self.say = say
        self.samples = cfg.logging.wandb.samples_per_step
        self.live: dict[str, Tracker] = {}
        for name in cfg.trackers if enabled else []:
            factory = TRACKERS.get(name)
            try:
                self.live[name] = factory(cfg, run_dir, say)
            except ImportError:
                raise  # its package is missing: the message names the extra to install, before any step is trained
            except Exception as err:
                self._drop(name, f"{type(err).__name__}: {err}")

    def __bool__(self) -> bool:
        return bool(self.live)

    def log_step(self, record: dict, episodes: Sequence[Episode] = ()) -> None:
        for name, tracker in list(self.live.items()):
            self._guarded(name, functools.partial(tracker.log_step, record))
            if self.samples and episodes and name in self.live:
                self._guarded(name, functools.partial(tracker.log_samples, record["step"], episodes[: self.samples]))

    def log_figures(self, step: int, draw: Callable[[], Sequence[Path]]) -> None:
        """The figures ``draw`` makes, to every tracker that wants them (drawn only if one does)."""
        wanting = {name: t for name, t in self.live.items() if t.wants_figures}
        if not wanting:
            return
        try:
            figures = draw()
        except Exception as err:  # the run is trained and saved: a figure that cannot be drawn is only a warning
            self.say(f"warning: the report's figures could not be drawn ({type(err).__name__}: {err}); the trackers get none")
            return
        for name, tracker in wanting.items():
            self._guarded(name, functools.partial(tracker.log_figures, step, figures))

    def close(self) -> None:
        for name, tracker in list(self.live.items()):
            self._guarded(name, tracker.close)
        self.live.clear()

    def _guarded(self, name: str, call: Callable[[], object]) -> None:
        try:
            call()
        except Exception as err:  # a view of the run must never cost a training step
            self._drop(name, f"{type(err).__name__}: {err}")

    def _drop(self, name: str, why: str) -> None:
        tracker = self.live.pop(name, None)
        self.say(f"warning: the {name} tracker stopped ({why}); training goes on, metrics.jsonl keeps every step")
        if tracker is not None:
            try:
                tracker.close()
            except Exception:
                pass  # it already failed once; the warning above says so
