"""A run directory's lifecycle: the one place where a run is started, resumed, logged and checkpointed.

``scope train`` (the :class:`~scope_marl.training.trainer.Trainer`), ``scope sft`` and every arm of the
LLM lab go through :class:`RunDir`, so each gets the same guarantees:

- **one process per run**: the directory's OS lock (``core.run_lock``) is taken before anything is
  read or written and held until the run ends; a second process is refused, naming the holder;
- **start or resume, never both**: a new run is refused where a run already is (naming the resume
  command), a resume is refused where no run was started;
- **config snapshot**: the config a run was started with is saved beside it, and a resume reads it;
- **metrics**: one JSON line per step, appended; on resume the lines of steps after the restored
  checkpoint (and a torn last line) are dropped, so every step appears once;
- **checkpoints**: written atomically with a manifest of sizes and hashes (``training.checkpoint``),
  the last ``keep_last`` kept plus the best; on resume a damaged one (it fails its manifest) is set
  aside with a warning and the next older one used, while a whole one that does not fit the run's
  models is an error about the config; a directory holding checkpoints is never a new run's;
- **rollout batches** written after the restored step are removed (they are played again).

Where things live inside the directory is :mod:`scope_marl.core.run_layout`.
Under data parallelism (torchrun) only the lead rank (rank 0) locks and writes; the others read.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from scope_marl.config import dump_config, load_saved_config
from scope_marl.core import files, run_layout
from scope_marl.core.run_lock import LOCK_FILE, RunLock
from scope_marl.rollout.recorder import RolloutRecorder
from scope_marl.training import checkpoint

C = TypeVar("C")
R = TypeVar("R")
Log = Callable[[str], None]


class RunDir:
    """A run directory held by this process. Build one with :meth:`new` or :meth:`existing`.

    ``command`` is the CLI command that writes this kind of run (``scope train``, ``scope sft``): error
    messages name it, so a user learns how to start again or resume; ``restart`` is how to start one
    afresh (default: ``COMMAND CONFIG --out NEW_DIR``)."""

    def __init__(self, path: str | Path, command: str = "scope train", lead: bool = True, restart: str | None = None):
        self.path = Path(path)
        self.command = command
        self.restart = restart or f"{command} CONFIG --out NEW_DIR"
        self.lead = lead
        self.lock: RunLock | None = None

    # ---- start or resume ------------------------------------------------------------------------
    @classmethod
    def new(cls, path: str | Path, command: str = "scope train", lead: bool = True) -> RunDir:
        """Lock ``path`` for a new run: refused when it already holds one, or another process holds it."""
        run = cls(path, command, lead)
        run.acquire()
        with run.released_on_error():
            if (run.path / run_layout.METRICS).exists() or run_layout.list_checkpoints(run.path):
                raise FileExistsError(f"{path} already holds a run; continue it with: {command} --resume {path}")
        return run

    @classmethod
    def start(cls, path: str | Path, cfg, build: Callable[[RunDir], R], command: str = "scope train", lead: bool = True) -> R:
        """A new run: :meth:`new`, then ``build(run)`` (the lock released if it fails), then ``cfg`` saved
        beside it, last, so a run that could not start leaves no config to resume from."""
        run = cls.new(path, command, lead)
        with run.released_on_error():
            built = build(run)
        run.write_config(cfg)
        return built

    @classmethod
    def existing(cls, path: str | Path, command: str = "scope train", lead: bool = True) -> RunDir:
        """Lock a started run to continue it (refused while another process holds it)."""
        run = cls(path, command, lead)
        # A run that is still starting holds its lock before it writes its config: try the lock first.
        if not any((run.path / name).exists() for name in (run_layout.CONFIG, LOCK_FILE)):
            raise FileNotFoundError(f"{path} has no {run_layout.CONFIG}: is it a run directory written by {command}?")
        run.acquire()
        return run

    def acquire(self) -> RunDir:
        if self.lead and (self.lock is None or not self.lock.held):
            self.lock = RunLock(self.path).acquire()
        return self

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def __enter__(self) -> RunDir:
        return self.acquire()

    def __exit__(self, *_exc) -> None:
        self.release()

    @contextlib.contextmanager
    def released_on_error(self) -> Iterator[RunDir]:
        """Release the lock if the block fails (a run that could not start or resume holds nothing)."""
        try:
            yield self
        except BaseException:
            self.release()
            raise

    # ---- config ---------------------------------------------------------------------------------
    def write_config(self, cfg) -> None:
        if self.lead:
            dump_config(cfg, self.path / run_layout.CONFIG)

    def read_config(self, config_type: type[C]) -> C:
        """The config the run was started with (what a resume continues)."""
        return read_config(self.path, config_type, self.command)

    # ---- metrics --------------------------------------------------------------------------------
    @property
    def metrics_path(self) -> Path:
        return self.path / run_layout.METRICS

    def append_metrics(self, record: dict) -> None:
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def trim_metrics(self, step: int, log: Log) -> None:
        """Drop metric lines of steps after ``step`` (the restored checkpoint's: they will be played
        again), and a torn last line (a crash mid-append)."""
        path = self.metrics_path
        if not path.exists():
            return
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        kept = []
        for number, line in enumerate(lines, 1):
            try:
                if json.loads(line)["step"] <= step:
                    kept.append(line)
            except (ValueError, KeyError, TypeError):
                if number < len(lines):
                    raise ValueError(f"{path} line {number} is not a metrics record; fix or remove that line, then resume") from None
                log(f"warning: dropped the torn last line of {path} (a crash mid-write)")
        files.write_text(path, "".join(line + "\n" for line in kept))

    # ---- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(self, step: int, keep_last: int, best: str | None = None, **contents) -> Path:
        """Write the checkpoint of ``step`` (``contents``: the arguments of ``training.checkpoint.save``
        after the step), then keep the last ``keep_last`` and the one named ``best``. Under a sharded
        run every rank calls this (each writes its shards); the lead alone prunes."""
        path = checkpoint.save(self.path, step, **contents)
        if self.lead:
            checkpoint.prune(self.path, keep_last, best)
        return path

    def load_newest_checkpoint(self, load: Callable[[Path], None], log: Log, quarantine: bool | None = None) -> Path:
        """Load the newest whole checkpoint with ``load(path)``, setting damaged ones aside (the lead does)."""
        quarantine = self.lead if quarantine is None else quarantine
        return checkpoint.load_newest(self.path, load, log, quarantine=quarantine, command=self.restart)

    def checkpointed_step(self) -> int:
        """The step of the newest complete checkpoint (0: none yet): how far a resume would start."""
        saved = run_layout.list_checkpoints(self.path)
        return int(run_layout.read_state(saved[-1])["step"]) if saved else 0

    # ---- rollouts -------------------------------------------------------------------------------
    @property
    def rollouts(self) -> Path:
        return self.path / run_layout.ROLLOUTS

    def trim_rollouts(self, step: int, log: Log) -> None:
        """Remove rollout batches written after ``step`` (batch k holds step k + 1's episodes)."""
        removed = RolloutRecorder.remove_batches_from(self.rollouts, step)
        if removed:
            log(f"removed {removed} rollout batch(es) of steps after {step} from {self.rollouts}; they are played again")


def read_config(path: str | Path, config_type: type[C], command: str = "scope train") -> C:
    """The config a run directory was started with."""
    saved = Path(path) / run_layout.CONFIG
    if not saved.exists():
        raise FileNotFoundError(f"{path} has no {run_layout.CONFIG}: is it a run directory written by {command}?")
    return load_saved_config(saved, config_type)
