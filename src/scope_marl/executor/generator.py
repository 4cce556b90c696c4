"""Rollouts generated ahead of the learner (``trainer.mode: async``): a generator process of its own.

The generator is a child process holding its own engine (models, environment, simulator), built by
a picklable factory, as a Ray worker is. The trainer talks to it through two queues:

- ``weights(version, adapters)``: adapter tensors after an update, tagged with the policy version
  (updates applied) they are;
- ``play(ticket, tasks, first_group, min_version, replayed)``: a batch, to start once the generator holds
  weights of at least ``min_version`` (with a population pool, ``replayed`` is the member it plays in
  the simulator's adapter). The trainer asks for batch ``t`` with ``min_version = t - k``
  (``trainer.max_staleness``), so nothing is trained on more than ``k`` versions after the weights that
  played it: admission control, not discarding, so long episodes are never dropped for being slow.

The generator serves requests in order, each batch with the newest weights it holds when it starts,
and answers each with its episodes, stamped with that version (``metadata.versions``), and its timings
(generating, waiting for weights). Between batches it applies whatever weights have arrived. Groups
keep the numbers the trainer gives them, so the same batch at the same weights is the same episodes as
the synchronous loop plays (``k = 0`` is the synchronous loop, run in two processes).
"""

from __future__ import annotations

import multiprocessing
import queue
import time
import traceback
from collections import deque
from collections.abc import Sequence
from typing import Any

from scope_marl.core.types import Episode
from scope_marl.envs.base import Task
from scope_marl.executor.base import EngineFactory, Replayed, load_adapter_tensors, play_replayed

POLL_S = 0.5  # how often a waiting side checks that the other process is alive


class GeneratorDied(RuntimeError):
    """The generator process ended or raised; the message carries its error."""


def _generate(factory: EngineFactory, threads: int, inbox, outbox) -> None:
    """The generator process's loop (module level: a spawned process imports it)."""
    import torch

    torch.set_num_threads(threads)
    try:
        engine = factory()
        version = -1  # no weights yet: every batch waits for the first push
        waiting: deque = deque()
        idle_since = time.perf_counter()
        parent = multiprocessing.parent_process()
        while True:
            try:
                message = inbox.get(timeout=POLL_S)
            except queue.Empty:
                if parent is not None and not parent.is_alive():
                    return  # the trainer was killed: an orphan generator would hold a model copy forever
                continue
            kind = message[0]
            if kind == "stop":
                return
            if kind == "weights":
                _, version, adapters, simulator_id = message
                load_adapter_tensors(engine, adapters)
                if simulator_id is not None:
                    engine.simulator.simulator_id = simulator_id
            elif kind == "play":
                waiting.append(message)
            while waiting and waiting[0][4] <= version:
                _, ticket, tasks, first_group, _, replayed = waiting.popleft()
                started = time.perf_counter()
                idle = started - idle_since
                play_replayed(engine, replayed)
                episodes = engine.run(tasks, first_group=first_group)
                for e in episodes:
                    e.metadata["behaviour_version"] = version
                idle_since = time.perf_counter()
                outbox.put(("episodes", ticket, episodes, {"version": version, "generate_s": idle_since - started, "idle_s": idle}))
    except BaseException:
        outbox.put(("error", None, traceback.format_exc(), {}))


class GeneratorExecutor:
    """One generator process; :meth:`submit` and :meth:`collect` overlap its plays with the caller's work."""

    parallelism = 1

    def __init__(self, factory: EngineFactory, threads: int = 1):
        import torch.multiprocessing as mp

        context = mp.get_context("spawn")  # a clean interpreter: no inherited torch threads or locks
        self._inbox, self._outbox = context.Queue(), context.Queue()
        self._process = context.Process(target=_generate, args=(factory, threads, self._inbox, self._outbox), daemon=True)
        self._process.start()
        self._tickets: deque[int] = deque()
        self._next_ticket = 0
        self.version = -1

    def describe(self) -> str:
        return f"a generator process (pid {self._process.pid})"

    def push(self, source, names: Sequence[str], version: int, simulator_id: str | None = None) -> None:
        self._inbox.put(("weights", version, {name: source.adapter_tensors(name) for name in names}, simulator_id))
        self.version = version

    def submit(self, tasks: Sequence[Task], first_group: int, min_version: int, replayed: Replayed | None = None) -> int:
        """Queue a batch (one group per task) to start once the generator holds weights >= ``min_version``
        (``replayed``: the pool member it plays in the simulator's adapter)."""
        ticket = self._next_ticket
        self._next_ticket += 1
        self._inbox.put(("play", ticket, list(tasks), first_group, min_version, replayed))
        self._tickets.append(ticket)
        return ticket

    def collect(self) -> tuple[list[Episode], dict[str, Any]]:
        """The oldest submitted batch's episodes (waiting for them) and its timings and version."""
        expected = self._tickets.popleft()
        while True:
            try:
                kind, ticket, payload, info = self._outbox.get(timeout=POLL_S)
            except queue.Empty:
                if not self._process.is_alive():
                    raise GeneratorDied(f"the generator process exited (code {self._process.exitcode}) with batches in flight") from None
                continue
            if kind == "error":
                raise GeneratorDied(f"the generator process failed:\n{payload}")
            if ticket != expected:
                raise GeneratorDied(f"the generator answered batch {ticket} while batch {expected} was due")  # FIFO broken: a bug
            return payload, info

    def map(self, jobs):
        """Jobs (an evaluation's plays) run here, on the learner's live model."""
        return [job() for job in jobs]

    def portable(self, agent):
        return agent

    def play(self, tasks: Sequence[Task], first_group: int = 0) -> list[Episode]:
        """A batch with the newest weights pushed (the synchronous interface)."""
        if self._tickets:
            raise RuntimeError("play is the synchronous call: collect the batches in flight first")
        self.submit(tasks, first_group, self.version)
        return self.collect()[0]

    def close(self) -> None:
        if self._process.is_alive():
            self._inbox.put(("stop",))
            self._process.join(timeout=30)
            if self._process.is_alive():
                self._process.kill()
        self._process.join()
