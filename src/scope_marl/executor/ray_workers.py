"""Rollouts on workers that are Ray actors (``executor: ray``).

Workers play whole GRPO groups with the seeds the local engine would give them (per-episode seeds:
a group's number, its rollout and turn decide every draw), so a Ray run reproduces the local one.

Ray workers:

- each is an actor holding its own engine (models, environment, simulator), built in the actor
  by a picklable factory, with torch on ``threads`` threads;
- a step's groups are cut into one contiguous block per worker (a group never spans workers) and
  each block keeps its groups' numbers;
- adapter updates go out once through the object store, tagged with a version; a worker asked to
  play a version it does not hold refuses (:class:`StaleWorker`) instead of sampling from old weights;
- a worker that dies is replaced (its factory runs again, the newest adapters are loaded) and its
  block is played again with the same group numbers, so the step's batch is what it would have been;
- asynchronous training (``trainer.mode: async``): :meth:`RayExecutor.submit` queues a batch's blocks on
  the workers without waiting and :meth:`RayExecutor.collect` gathers the oldest; pushes do not wait
  either. An actor runs its calls in the order they were made, so a block plays with the adapters
  pushed before it was submitted: the trainer submits batch ``t`` after pushing version ``t - k`` or
  newer, which is the admission control of docs/async.md. The blocks of a worker that died (of the batch
  being collected and of those queued after it) are played again by its replacement, which holds the
  newest adapters (never older than a block's minimum);
- :meth:`RayExecutor.map` runs other picklable jobs on the same workers (an evaluation panel's
  (simulator, task block) plays), a job of a dead worker again on its replacement.

Asking for more CPUs than the cluster has (``workers x num_cpus``) is an error at once: Ray would
otherwise wait for them forever.

Ray is an optional extra (``pip install -e '.[ray]'``), imported only here and only when asked for.
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps a local cluster's services on 127.0.0.1.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from scope_marl.core.types import Episode
from scope_marl.envs.base import Task
from scope_marl.executor.base import EngineFactory, Replayed, load_adapter_tensors, play_replayed, split_blocks

T = TypeVar("T")


class StaleWorker(RuntimeError):
    """A worker was asked to play with adapter weights it does not hold."""


def _require_ray():
    try:
        import ray
    except ModuleNotFoundError:
        raise ModuleNotFoundError("executor 'ray' needs Ray: pip install -e '.[ray]' (make setup installs it)") from None
    return ray


def connect(address: str | None = None):
    """Ray, initialized: joined to the cluster at ``address``, or a local one started here (its
    services on 127.0.0.1). Returns (ray, whether this call started it: then the caller shuts it down)."""
    ray = _require_ray()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # a local cluster listens on 127.0.0.1 only
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        return ray, False
    ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    return ray, True


def raised_cause(ray, err: Exception) -> BaseException:
    """The exception a Ray task raised, unwrapped, so a user sees the real error and not Ray's wrapper."""
    if isinstance(err, ray.exceptions.RayTaskError):
        return err.cause if isinstance(err.cause, BaseException) else err.as_instanceof_cause()
    return err


class _Worker:
    """The actor body: one engine, the adapter version it holds, and a ``play`` that checks it."""

    def __init__(self, factory: EngineFactory | None, threads: int):
        import torch

        torch.set_num_threads(threads)
        self.engine = factory() if factory is not None else None  # None: a worker for jobs only (scope eval)
        self.version = 0
        self.idle_since = time.perf_counter()

    def load(self, adapters: dict[str, dict[str, Any]], version: int, simulator_id: str | None = None) -> int:
        if self.engine is not None:
            load_adapter_tensors(self.engine, adapters)
        if simulator_id is not None and self.engine is not None:  # a pool member now plays in the simulator adapter
            self.engine.simulator.simulator_id = simulator_id
        self.version = version
        return version

    def play(
        self, tasks: Sequence[Task], first_group: int, version: int, at_least: bool = False, replayed: Replayed | None = None
    ) -> tuple[list[Episode], dict]:
        """Play a block with adapter ``version`` (``at_least``: that version or a newer one, asynchronous
        training; the episodes then name the version that played them; ``replayed``: the pool member
        the batch plays in the simulator's adapter)."""
        if version > self.version if at_least else version != self.version:
            raise StaleWorker(f"this worker holds adapter version {self.version}, asked to play version {version}")
        started_tokens = self.engine.stats.generated_tokens
        started = time.perf_counter()
        play_replayed(self.engine, replayed)
        episodes = self.engine.run(tasks, first_group)
        if at_least:
            for e in episodes:
                e.metadata["behaviour_version"] = self.version
        idle, self.idle_since = started - self.idle_since, time.perf_counter()
        return episodes, {
            "generated_tokens": self.engine.stats.generated_tokens - started_tokens,
            "generate_s": self.idle_since - started,
            "idle_s": idle,
        }

    def call(self, job: Callable[[], T]) -> T:
        return job()

    def pid(self) -> int:
        return os.getpid()


@dataclass
class _Batch:
    """A batch queued on the workers and not yet collected."""

    tasks: list[Task]
    first_group: int
    version: int  # the adapter version its blocks play with: exactly (a sync play) or at least (async)
    exact: bool
    blocks: list[tuple[int, int]]  # per worker: its tasks [start, stop)
    replayed: Any = None  # object-store ref of the pool member it plays in the simulator's adapter, or None
    running: dict[int, tuple[Any, Any]] = field(default_factory=dict)  # worker index -> (actor, result ref)


class RayExecutor:
    """Rollout workers as Ray actors; see the module doc. ``workers`` is how many plays run at once."""

    def __init__(
        self,
        factory: EngineFactory | None,
        workers: int = 2,
        address: str | None = None,
        threads: int = 1,
        num_cpus: float = 1,
        asynchronous: bool = False,
    ):
        ray, self._started_ray = connect(address)
        self._ray = ray
        cpus = ray.cluster_resources().get("CPU", 0)
        if workers * num_cpus > cpus:  # Ray would wait forever for cores that never come
            if self._started_ray:
                ray.shutdown()
            raise ValueError(
                f"ray.workers {workers} x ray.num_cpus {num_cpus:g} needs {workers * num_cpus:g} CPUs but the Ray cluster has {cpus:g}; "
                "lower ray.workers, or ray.num_cpus (e.g. 0.5 to share a core)"
            )
        self._actor_class = ray.remote(num_cpus=num_cpus, max_restarts=0)(_Worker)
        self._factory, self._threads = factory, threads
        self.version = 0
        self._latest: dict[str, dict[str, Any]] = {}  # every adapter pushed so far, newest tensors: for replacements
        self._simulator_id: str | None = None
        self.workers = [self._new_worker() for _ in range(workers)]
        ray.get([w.pid.remote() for w in self.workers])  # fail here, not mid-step, if a factory cannot build
        self.restarts = 0
        self.generated_tokens = 0
        # Asynchronous training: pushes are not waited for, and batches queue on the workers (submit / collect; play is both).
        self.asynchronous = asynchronous
        self._loads: list = []  # refs of pushes not yet checked
        self._queued: deque[_Batch] = deque()

    def _new_worker(self):
        worker = self._actor_class.remote(self._factory, self._threads)
        if self._latest:  # a replacement starts from fresh adapters: it gets every adapter pushed so far
            self._ray.get(worker.load.remote(self._ray.put(self._latest), self.version, self._simulator_id))
        return worker

    @property
    def parallelism(self) -> int:
        return len(self.workers)

    def describe(self) -> str:
        return f"{len(self.workers)} Ray worker(s)"

    def portable(self, agent):
        """What an evaluation job carries to a worker: the agent as data that pickles."""
        return agent.recipe()

    def push(self, source, names: Sequence[str], version: int, simulator_id: str | None = None) -> None:
        """Send adapters ``names`` of the learner's model ``source`` to every worker (see :meth:`send`)."""
        self.send({name: source.adapter_tensors(name) for name in names}, version, simulator_id)

    def send(self, adapters: dict[str, dict[str, Any]], version: int, simulator_id: str | None = None) -> None:
        """Send changed adapter tensors to every worker once (one object-store copy), tagged ``version``
        (and the simulator's new id, when a pool member was loaded into its adapter)."""
        ref = self._ray.put(adapters)
        loads = [w.load.remote(ref, version, simulator_id) for w in self.workers]
        if self.asynchronous:
            self._loads += loads  # the workers load it before any block submitted after this; collect() checks them
        else:
            self._ray.get(loads)
        self._latest.update(adapters)
        self._simulator_id = simulator_id or self._simulator_id
        self.version = version

    def play(self, tasks: Sequence[Task], first_group: int = 0) -> list[Episode]:
        """Play ``tasks`` (one group each, numbered from ``first_group``) across the workers, in task order."""
        if self._queued:
            raise RuntimeError("play is the synchronous call: collect the batches in flight first")
        self._queue(tasks, first_group, self.version, exact=True)
        return self.collect()[0]

    def submit(self, tasks: Sequence[Task], first_group: int, min_version: int, replayed: Replayed | None = None) -> None:
        """Queue a batch (one group per task, numbered from ``first_group``) on the workers without waiting:
        each block plays with the adapters pushed before this call (at least ``min_version``) and, with
        ``replayed``, that pool member in the simulator's adapter."""
        self._queue(tasks, first_group, min_version, exact=False, replayed=replayed)

    def _queue(self, tasks: Sequence[Task], first_group: int, version: int, exact: bool, replayed: Replayed | None = None) -> None:
        """One block per worker (a group never spans workers), each keeping its groups' numbers."""
        blocks = [(start, stop) for start, stop in split_blocks(len(tasks), len(self.workers)) if start < stop]
        member = self._ray.put(replayed) if replayed is not None else None  # one object-store copy for every block
        batch = _Batch(list(tasks), first_group, version, exact, blocks, member)
        for w, block in enumerate(blocks):
            batch.running[w] = self._play_block(batch, w, block)
        self._queued.append(batch)

    def _play_block(self, batch: _Batch, w: int, block: tuple[int, int]) -> tuple[Any, Any]:
        worker, (start, stop) = self.workers[w], block
        return worker, worker.play.remote(
            batch.tasks[start:stop], batch.first_group + start, batch.version, not batch.exact, batch.replayed
        )

    def collect(self) -> tuple[list[Episode], dict[str, Any]]:
        """The oldest queued batch's episodes, in task order (waiting for them), with its timings: the
        workers' generating seconds and their idle seconds before it, summed over workers. A block whose
        worker died is played again, with the same group numbers, by a replacement holding the newest adapters."""
        ray = self._ray
        self._check_loads()
        batch = self._queued.popleft()
        results: dict[int, list[Episode]] = {}
        info = {"generate_s": 0.0, "idle_s": 0.0}
        while batch.running:
            w, (worker, ref) = next(iter(batch.running.items()))
            try:
                episodes, stats = ray.get(ref)
            except ray.exceptions.RayActorError:
                # The worker died: a replacement plays its block of this batch again, and at once its blocks of the
                # later batches queued on the dead actor (so they overlap the learner's next updates as before).
                self.restarts += 1
                self.workers[w] = self._new_worker()
                for queued in (batch, *self._queued):
                    if queued.running.get(w, (None,))[0] is worker:
                        queued.running[w] = self._play_block(queued, w, queued.blocks[w])
                continue
            except ray.exceptions.RayTaskError as err:
                raise raised_cause(ray, err) from None
            self.generated_tokens += stats["generated_tokens"]
            info["generate_s"] += stats["generate_s"]
            info["idle_s"] += stats["idle_s"]
            results[w] = episodes
            del batch.running[w]
        return [e for w in sorted(results) for e in results[w]], info

    def _check_loads(self) -> None:
        """Raise a push's own error (a dead worker's is handled where its block is collected)."""
        ray, loads, self._loads = self._ray, self._loads, []
        for ref in loads:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                pass
            except ray.exceptions.RayTaskError as err:
                raise raised_cause(ray, err) from None

    def map(self, jobs: Sequence[Callable[[], T]]) -> list[T]:
        """Run picklable zero-argument jobs (an evaluation panel's (simulator, task block) plays) on the
        workers, one at a time each, the next job to the first worker free; results in job order. A job
        whose worker dies runs again on its replacement; a job's own error is raised as it is."""
        ray = self._ray
        queue = list(range(len(jobs)))
        running: dict[int, tuple[int, Any]] = {}  # worker index -> (job index, result ref)
        results: dict[int, T] = {}
        while queue or running:
            for w in range(len(self.workers)):
                if w not in running and queue:
                    j = queue.pop(0)
                    running[w] = (j, self.workers[w].call.remote(jobs[j]))
            ready, _ = ray.wait([ref for _, ref in running.values()], num_returns=1)
            w = next(w for w, (_, ref) in running.items() if ref == ready[0])
            j, ref = running.pop(w)
            try:
                results[j] = ray.get(ref)
            except ray.exceptions.RayActorError:
                self.restarts += 1
                self.workers[w] = self._new_worker()
                queue.insert(0, j)
            except ray.exceptions.RayTaskError as err:
                raise raised_cause(ray, err) from None
        return [results[j] for j in range(len(jobs))]

    def worker_pids(self) -> list[int]:
        return self._ray.get([w.pid.remote() for w in self.workers])

    def close(self) -> None:
        for w in self.workers:
            self._ray.kill(w)
        self.workers = []
        if self._started_ray:
            self._ray.shutdown()
