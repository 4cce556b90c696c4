"""Two lanes on two cores: this process, and one worker process it starts, with one progress display.

Decoding on a CPU is bound by memory bandwidth (one thread decodes as fast as two), so two lanes
side by side with torch on one thread each take little longer than one. :class:`TwoLanes` runs the
worker lane's jobs in order in a spawned process while the caller runs the main lane; both report
finished stages to one :class:`Progress`, which prints the elapsed time and an estimate of what
remains from each stage's cost on a reference machine, scaled by this machine's GEMM speed.
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor

MAIN_LANE, WORKER_LANE = "main", "worker"

# Seconds each stage took on the reference machine (2 cores, torch fp32 GEMM at REFERENCE_GFLOPS),
# measured with `scope demo` from an empty $SCOPE_CACHE. A stage's estimate here is its reference time
# scaled by REFERENCE_GFLOPS / this machine's GEMM, then by how the stages so far compared with theirs.
REFERENCE_GFLOPS = 134.0
REFERENCE_SECONDS = {"effect": 27.0, "convert": 23.0, "start": 2.0, "step:frozen": 18.0, "step:vs_prob": 23.0, "eval": 23.0, "report": 3.0}
TIME_LIMIT_AT_70 = 300.0  # the promise: 5 minutes on a 70 GFLOP/s machine, i.e. 300 x 70 / G seconds here


def time_limit(gflops: float) -> float:
    """The most seconds the demo may take on a machine whose GEMM runs at ``gflops``."""
    return TIME_LIMIT_AT_70 * 70.0 / gflops


class Progress:
    """Elapsed time and what remains, as lines: ``[2/3 llm] frozen step 1/2 ... | 52 s elapsed, ~80 s left``.

    Stages run in lanes; each lane lists its stages with their reference seconds. What remains is the
    longest lane's pending reference time, scaled to this machine's GEMM speed and by the ratio of
    actual to estimated time over the stages done so far (so a machine slower than its GEMM suggests
    is caught early). Thread-safe: the worker lane's events arrive on a thread.
    """

    def __init__(
        self,
        lanes: dict[str, list[tuple[str, float]]],
        gflops: float,
        log: Callable[[str], None],
        clock=time.perf_counter,
        prior: float = 20.0,
    ):
        self.prior = prior  # estimated seconds the correction starts from, so one odd first stage cannot swing it
        self.pending = {lane: list(stages) for lane, stages in lanes.items()}
        self.scale = REFERENCE_GFLOPS / gflops
        self.log, self.clock = log, clock
        self.started = clock()
        self.last = dict.fromkeys(lanes, self.started)
        self.actual = self.estimated = 0.0
        self.lock = threading.Lock()

    def remaining(self) -> float:
        correction = (self.actual + self.prior) / (self.estimated + self.prior) if self.estimated + self.prior else 1.0
        return correction * self.scale * max((sum(s for _, s in stages) for stages in self.pending.values()), default=0.0)

    def elapsed(self) -> float:
        return self.clock() - self.started

    def done(self, lane: str, stage: str, message: str) -> None:
        """Mark the first pending ``stage`` of ``lane`` finished and print ``message`` with the times."""
        self.done_together(lane, [(stage, message)])

    def done_together(self, lane: str, finished: list[tuple[str, str]]) -> None:
        """Mark stages of ``lane`` finished at once, each (stage, message) as :meth:`done` does; the time
        since the lane's last stage counts for all of them together."""
        with self.lock:
            now = self.clock()
            stages = self.pending[lane]
            for stage, _ in finished:
                _, reference = stages.pop(next(i for i, (name, _) in enumerate(stages) if name == stage))
                self.estimated += reference * self.scale
            self.actual += now - self.last[lane]
            self.last[lane] = now
            for _, message in finished:
                self.log(f"{message} | {self.elapsed():.0f} s elapsed, ~{self.remaining():.0f} s left")


# ---- the worker process --------------------------------------------------------------------------
_events = None  # in the worker process: the queue its progress events go to


def _worker_init(events, threads: int | None) -> None:
    global _events
    _events = events
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def worker_report(*finished: tuple[str, str]) -> None:
    """In a job of the worker lane: these (stage, message) are done (the main process prints each
    message with the times)."""
    _events.put((WORKER_LANE, list(finished)))


def _relay(events, progress: Progress, stop: threading.Event) -> None:
    """Print the worker's progress events as they come, until the None that ends them (or ``stop``)."""
    while not stop.is_set():
        try:
            event = events.get(timeout=0.1)
        except queue.Empty:
            continue
        if event is None:
            return
        progress.done_together(*event)


# ---- the lanes -----------------------------------------------------------------------------------
class TwoLanes:
    """``with TwoLanes(progress) as lanes:`` runs the main lane in the body, here, and the worker lane in
    one spawned process: :meth:`submit` queues a job there (jobs run in order) and returns its future.
    The main lane reports finished stages with :meth:`report`, a worker job with :func:`worker_report`
    (both take (stage, message) pairs). Both lanes run torch on ``threads`` threads (None: leave
    torch alone).

    When the body raises, the worker process is terminated (the pool would otherwise wait for its job)
    and the error goes on. Only that process: the lanes end what they started, never another child
    of this process.
    """

    def __init__(self, progress: Progress, threads: int | None = 1):
        self.progress, self.threads = progress, threads

    def __enter__(self) -> TwoLanes:
        context = multiprocessing.get_context("spawn")
        self.events = context.Queue()
        self.stop = threading.Event()
        self.listener = threading.Thread(target=_relay, args=(self.events, self.progress, self.stop), daemon=True)
        self.listener.start()
        self.saved_threads = None
        if self.threads is not None:
            import torch

            self.saved_threads = torch.get_num_threads()
            torch.set_num_threads(self.threads)
        self.pool = ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=_worker_init, initargs=(self.events, self.threads))
        return self

    def submit(self, job: Callable, *args) -> Future:
        """Run ``job(*args)`` in the worker process, after the jobs submitted before it."""
        return self.pool.submit(job, *args)

    def report(self, *finished: tuple[str, str]) -> None:
        """These (stage, message) of the main lane are done."""
        self.progress.done_together(MAIN_LANE, list(finished))

    def processes(self) -> list[multiprocessing.Process]:
        """The worker processes this pool started (one, once a job was submitted)."""
        # ProcessPoolExecutor keeps its processes in _processes (pid -> Process) on every Python from 3.8;
        # Python 3.14's terminate_workers() ends the same ones.
        return list((self.pool._processes or {}).values())

    def terminate(self) -> None:
        """End the worker process(es) this pool started, and nothing else."""
        for process in self.processes():
            process.terminate()

    def __exit__(self, kind, error, traceback) -> None:
        try:
            if kind is not None:
                self.terminate()
            self.pool.shutdown(wait=True, cancel_futures=kind is not None)
        finally:
            if self.saved_threads is not None:
                import torch

                torch.set_num_threads(self.saved_threads)
            if kind is None:
                self.events.put(None)  # after every event of the finished worker: the listener prints them all
            else:
                self.stop.set()  # a terminated worker may have left the queue mid-write
            self.listener.join()
