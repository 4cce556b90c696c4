"""Rollouts in this process on a sampler server (``sampler: vllm:MODEL@URL``) that receives the
learner's LoRA adapters through disk: a server loads adapters from folders, not from tensors.

Synchronous (the default): each push saves the changed adapters as ``NAME-vVERSION`` folders, the
server loads them under that version and the previous version is unloaded.

Asynchronous (``trainer.mode: async``): a play thread of this process plays the submitted batches in
order on an engine of its own (the same seats, environment and simulator; its own group counter), while
the caller trains. The thread is mostly waiting on the server, so it does not compete with the
learner for the interpreter. Each batch starts once the server holds version ``min_version`` or newer
(admission control, as on the generator process), plays with the newest versions pushed when it
starts, pinned for its whole length (:meth:`VLLMChatModel.pinned`), and stamps its episodes with that
version. A version replaced by a newer push stays loaded (and its folder on disk) until no batch plays
with it any more. With a population pool, a batch submitted with a member loads it on the server for
that batch only, from a copy taken at submission (the pool may evict the member before the batch plays).
"""

from __future__ import annotations

import copy
import queue
import shutil
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scope_marl.core import files, run_layout
from scope_marl.core.types import Episode
from scope_marl.envs.base import Task
from scope_marl.executor.base import LocalExecutor, Replayed
from scope_marl.rollout.engine import RolloutEngine

POLL_S = 0.5  # how often a waiting collect checks that the play thread is alive


class SamplerExecutor(LocalExecutor):
    """The engine here, its seats on the server; adapters pushed are saved under ``folder`` as
    ``NAME-vVERSION`` and loaded by the server under that version. ``asynchronous``: batches are
    played ahead by a thread (:meth:`submit`, :meth:`collect`)."""

    def __init__(self, engine: RolloutEngine, folder: str | Path, asynchronous: bool = False):
        super().__init__(engine)
        self.folder = Path(folder)
        self.sampler = engine.agent.model
        self.version = -1  # the newest version pushed: a batch waits for its min_version
        self._newest: dict[str, tuple[str, Path]] = {}  # adapter -> (served name, folder) of its newest version
        self._replaced: dict[str, Path] = {}  # served name -> folder: older versions, unloaded once no batch holds them
        self._holds: Counter[str] = Counter()  # served name -> batches playing with it now
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = False
        if asynchronous:
            # Its own engine: the trainer's keeps counting groups while this one plays (same seats and env), and
            # its own simulator object, whose simulator_id names the pool member of the batch it plays.
            self._player = RolloutEngine(engine.env, engine.agent, copy.copy(engine.simulator), engine.config)
            self._requests: queue.Queue = queue.Queue()
            self._results: queue.Queue = queue.Queue()
            self._tickets: deque[int] = deque()
            self._next_ticket = 0
            for leftover in self.folder.glob("pool-*"):  # members copied for batches a killed run never played
                shutil.rmtree(leftover, ignore_errors=True)
            self._thread = threading.Thread(target=self._play_loop, name="sampler-play", daemon=True)
            self._thread.start()

    # ---- adapters ------------------------------------------------------------------------------
    def push(self, source, names: Sequence[str], version: int, simulator_id: str | None = None) -> None:
        loaded = {}
        for name in sorted(names):
            target = self.folder / f"{name}-v{version}"
            with files.atomic_directory(target) as tmp:
                source.model.save_pretrained(tmp, selected_adapters=[name])
            loaded[name] = (self.sampler.load_adapter(name, run_layout.adapter_path(target, name), version, unload_previous=False), target)
        with self._changed:  # every adapter of a push at once: a batch never starts between two of them
            for name, (served, target) in loaded.items():
                old = self._newest.get(name)
                if old is not None and old[0] != served:
                    self._replaced[old[0]] = old[1]
                self._newest[name] = (served, target)
            self.version = max(self.version, version)
            self._changed.notify_all()
        self._unload_unheld()
        with self._changed:
            kept = {folder for _, folder in self._newest.values()} | set(self._replaced.values())
        for name in loaded:  # and folders a killed run left behind
            for old in self.folder.glob(f"{name}-v*"):
                if old not in kept:
                    shutil.rmtree(old, ignore_errors=True)

    def _unload_unheld(self) -> None:
        """Unload the replaced versions no batch plays with, and delete their folders. If the server
        refuses, its error is raised and the versions not yet unloaded are listed again (tried at the next cleanup)."""
        with self._changed:  # taken off the books here, so the other thread never unloads them too
            free = [(served, folder) for served, folder in self._replaced.items() if not self._holds[served]]
            for served, _ in free:
                del self._replaced[served]
        for done, (served, folder) in enumerate(free):
            try:
                self.sampler.unload(served)
            except BaseException:
                with self._changed:  # still on the server: listed again, tried at the next cleanup
                    self._replaced.update(free[done:])
                raise
            shutil.rmtree(folder, ignore_errors=True)

    # ---- asynchronous plays --------------------------------------------------------------------
    def _play_loop(self) -> None:
        idle_since = time.perf_counter()
        while True:
            request = self._requests.get()
            if request is None:
                return
            ticket, tasks, first_group, min_version, member = request
            with self._changed:
                self._changed.wait_for(lambda needed=min_version: self.version >= needed or self._closing)
                if self._closing:
                    return
                version = self.version
                pins = {name: served for name, (served, _) in self._newest.items()}
                self._holds.update(pins.values())
            started = time.perf_counter()
            try:
                plays = dict(pins)
                if member is not None:  # (replayed, its copy): loaded under a name of its own for this batch only
                    replayed, folder = member
                    plays[replayed.adapter] = self.sampler.load_adapter(folder.name, folder, 0)
                    self._player.simulator.simulator_id = replayed.simulator_id
                with self.sampler.pinned(plays):
                    episodes = self._player.run(tasks, first_group=first_group)
                for e in episodes:
                    e.metadata["behaviour_version"] = version
                result = (
                    ticket,
                    episodes,
                    {"version": version, "generate_s": time.perf_counter() - started, "idle_s": started - idle_since},
                )
            except BaseException as err:  # handed to the caller's collect, which raises it there
                result = (ticket, err, {})
            with self._changed:
                self._holds.subtract(pins.values())
            try:
                self._unload_unheld()
                if member is not None:
                    self.sampler.remove_adapter(member[1].name)
                    shutil.rmtree(member[1], ignore_errors=True)
            except BaseException as err:
                result = (ticket, err, {})
            idle_since = time.perf_counter()
            self._results.put(result)

    def submit(self, tasks: Sequence[Task], first_group: int, min_version: int, replayed: Replayed | None = None) -> int:
        """Queue a batch (one group per task) to start once the server holds version >= ``min_version``
        (``replayed``: the pool member it plays in the simulator's adapter)."""
        if self._thread is None:
            raise RuntimeError("submit needs an asynchronous sampler executor (trainer.mode: async)")
        ticket = self._next_ticket
        self._next_ticket += 1
        member = None
        if replayed is not None:
            folder = self.folder / f"pool-{replayed.member_id}-batch{ticket}"
            with files.atomic_directory(folder) as tmp:
                for source in replayed.path.iterdir():  # file by file: pool members are read-only, their copies need not be
                    if source.is_file():
                        shutil.copyfile(source, tmp / source.name)
            member = (replayed, folder)
        self._tickets.append(ticket)
        self._requests.put((ticket, list(tasks), first_group, min_version, member))
        return ticket

    def collect(self) -> tuple[list[Episode], dict[str, Any]]:
        """The oldest submitted batch's episodes (waiting for them), its timings and version."""
        expected = self._tickets.popleft()
        while True:
            try:
                ticket, payload, info = self._results.get(timeout=POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive():
                    raise RuntimeError("the sampler's play thread ended with batches in flight") from None
        if ticket != expected:
            raise RuntimeError(f"the play thread answered batch {ticket} while batch {expected} was due")  # FIFO broken: a bug
        if isinstance(payload, BaseException):
            raise payload
        return payload, info

    def play(self, tasks: Sequence[Task], first_group: int = 0) -> list[Episode]:
        if self._thread is None:
            return super().play(tasks, first_group)
        if self._tickets:
            raise RuntimeError("play is the synchronous call: collect the batches in flight first")
        self.submit(tasks, first_group, self.version)
        return self.collect()[0]

    def describe(self) -> str:
        return "this process, sampling on the server" + (" (a play thread ahead of the learner)" if self._thread else "")

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            with self._changed:
                self._closing = True  # a batch waiting for weights that will never come stops waiting
                self._changed.notify_all()
            self._requests.put(None)
            self._thread.join(timeout=60)
