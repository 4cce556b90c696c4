"""The Weights & Biases tracker (``logging.trackers: [wandb]``, the ``wandb`` extra, imported only here).

- **Online or offline.** ``logging.wandb.mode: auto`` logs online when an API key is at hand
  (``WANDB_API_KEY``, or a ``wandb login`` in ``~/.netrc``) and offline otherwise, and says which at
  start; offline runs are uploaded later with ``wandb sync RUN_DIR/wandb/offline-run-*``.
- **What is logged.** The run's config; every step's metrics line (nested keys as ``a/b`` paths, at
  W&B step = the training step); a table of a few of the step's dialogues; the report's figures once
  the last step is trained.
- **Resume.** The W&B run id is kept in ``RUN_DIR/wandb-run.json``, so ``scope train --resume``
  continues the same W&B run. W&B writes its log every :data:`FLUSH_S` seconds, and a SIGKILL loses
  what it had not written, so the file also keeps the last step surely written. A step's row leaves
  for W&B only when a later step is logged (``run.log(..., step=N)`` gathers step N until then), so a
  step counts as written once that happened more than two flushes before a later log, or once the run
  closed normally. A resumed run logs every step after that one: those up to its checkpoint from
  ``metrics.jsonl``, the rest as they are played again (a sync resume plays them number for number).
  Nothing is lost; a step logged in the killed run's last seconds may appear twice (W&B cannot cut a
  run's history back: its "rewind" is a private preview).
"""

from __future__ import annotations

import json
import netrc
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import urlparse

from scope_marl.config.train import TrainConfig
from scope_marl.core import files, run_layout
from scope_marl.core.types import Episode
from scope_marl.training.tensorboard import flatten

FLUSH_S = 1.0  # how often W&B writes its run log (.wandb file): what a SIGKILL can cost W&B (metrics.jsonl loses nothing)


def has_api_key() -> bool:
    """Whether W&B would find credentials: ``WANDB_API_KEY``, or a netrc entry for its host (``wandb login``)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def dialogue_text(episode: Episode) -> str:
    return "\n".join(f"{m.role}: {m.content}" for m in episode.messages if m.role != "system")


class WandbTracker:
    wants_figures = True

    def __init__(self, cfg: TrainConfig, run_dir: Path, say: Callable[[str], None]):
        try:
            import wandb
        except ImportError:
            raise ImportError(
                "logging.trackers names wandb but the wandb package is missing; install it with "
                "pip install 'scope-marl[wandb]' (or remove wandb from logging.trackers)"
            ) from None
        self.wandb = wandb
        settings = cfg.logging.wandb
        self.state_path = run_dir / run_layout.WANDB_RUN
        state = json.loads(self.state_path.read_text()) if self.state_path.is_file() else {}
        mode = settings.mode if settings.mode != "auto" else ("online" if has_api_key() else "offline")
        if settings.mode == "auto":
            say(
                "wandb: no API key (WANDB_API_KEY or wandb login), logging offline to RUN_DIR/wandb; upload later with wandb sync"
                if mode == "offline"
                else "wandb: logging online (API key found)"
            )
        self.run_dir = run_dir
        # The last step surely in W&B's log (its row sent more than 2 flushes before a later log): a resume
        # logs every step after it, from metrics.jsonl up to the checkpoint and then as they are played.
        self.durable = int(state.get("durable_step", 0))
        self.resumed = bool(state)
        self.gathering: int | None = None  # the step whose row W&B is still gathering (sent with the next step's log)
        self.pending: list[tuple[int, float]] = []  # (step, when its row was sent) not yet known to be written
        self.fresh_step: int | None = None  # the step this process logged last (samples go only with a logged step)
        self.run = wandb.init(
            project=settings.project,
            entity=settings.entity,
            name=settings.name or run_dir.resolve().name,
            tags=settings.tags or None,
            config=cfg.model_dump(mode="json"),
            dir=str(run_dir),
            id=state.get("id"),  # None the first time: W&B makes one, kept for resumes
            resume="allow",
            mode=mode,
            # W&B buffers its offline log and writes it every 15 s by default: a killed run would lose that much.
            settings=wandb.Settings(console="off", silent=True, x_transaction_log_flush_interval=FLUSH_S),
        )
        self.run_id = self.run.id
        self._save_state()
        if state:
            say(f"wandb: continuing W&B run {self.run_id} after step {self.durable}")

    def _save_state(self) -> None:
        files.write_json(self.state_path, {"id": self.run_id, "durable_step": self.durable})

    def log_step(self, record: dict) -> None:
        step = record["step"]
        if self.resumed:  # steps up to the checkpoint that W&B may not have written before the kill
            self.resumed = False
            for line in (self.run_dir / run_layout.METRICS).read_text().splitlines():
                earlier = json.loads(line)
                if self.durable < earlier["step"] < step:
                    self._log(earlier)
        if step > self.durable:
            self._log(record)
            self.fresh_step = step

    def _log(self, record: dict) -> None:
        now = time.monotonic()
        # ``run.log(..., step=N)`` only gathers step N's row; W&B sends it when a later step is logged
        # (or at finish), so the previous step's row leaves now and its clock starts here.
        if self.gathering is not None:
            self.pending.append((self.gathering, now))
        self.run.log(flatten({k: v for k, v in record.items() if k != "step"}), step=record["step"])
        self.gathering = record["step"]
        while self.pending and now - self.pending[0][1] >= 2 * FLUSH_S:
            self.durable = self.pending.pop(0)[0]
        self._save_state()

    def log_samples(self, step: int, episodes: Sequence[Episode]) -> None:
        if step != self.fresh_step:
            return
        table = self.wandb.Table(columns=["step", "episode", "task", "status", "reward_agent", "dialogue"])
        for e in episodes:
            table.add_data(step, e.episode_id, e.task_id, str(e.status.value), e.rewards.get("agent"), dialogue_text(e))
        self.run.log({"samples": table}, step=step)

    def log_figures(self, step: int, figures: Sequence[Path]) -> None:
        self.run.log({f"figures/{Path(f).stem}": self.wandb.Image(str(f)) for f in figures}, step=step)

    def close(self) -> None:
        self.run.finish()  # writes everything
        if self.gathering is not None:
            self.durable = self.gathering
            self._save_state()
