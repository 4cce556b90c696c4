"""Agent replies for every waiting participant, batched into one generate call per model, streamed.

One worker thread owns generation. Conversations that wait for the agent are queued (a bounded
queue: beyond it a participant is asked to wait and nothing is stored); the worker takes everything
queued after a short gathering window and makes one generate call per loaded model, every condition's
adapter in the same call. A local transformers model reports each sampled token as it is sampled,
and the reply's text so far is what the page streams; other backends (an API, scripted replies)
deliver the whole reply at once. A reply is committed to the database only once it is complete.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

from scope_marl.core.seeds import derive_seed
from scope_marl.core.types import SamplingParams
from scope_marl.study.agents import Conditions
from scope_marl.study.store import AGENT, Store

log = logging.getLogger("scope_marl.study")


@dataclass
class Reply:
    """The agent's reply being written for one participant: its text so far, and how it ended."""

    text: str = ""
    done: bool = False
    index: int | None = None  # the message index it was stored under
    error: str | None = None
    version: int = 0  # bumped on every change, so a listener knows when to send

    def update(self, **changes) -> None:
        for key, value in changes.items():
            setattr(self, key, value)
        self.version += 1


@dataclass
class _Row:
    participant: str
    reply: Reply
    prompt: list
    adapter: str | None
    seed: int
    ids: list[int]


class ReplyWorker:
    def __init__(
        self, store: Store, conditions: Conditions, sampling: SamplingParams, queue_limit: int, seed: int = 0, window_s: float = 0.02
    ):
        self.store = store
        self.conditions = conditions
        self.sampling = sampling
        self.queue_limit = queue_limit
        self.seed = seed
        self.window_s = window_s
        self.batch_sizes: list[int] = []  # rows per generate call (what the load bench reports)
        self._queue: list[str] = []
        self._replies: dict[str, Reply] = {}
        self._cv = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="study-replies", daemon=True)

    def start(self) -> int:
        """Queue every conversation that waits for the agent (after a restart: where each stopped), then start."""
        waiting = self.store.waiting()
        with self._cv:
            for pid in waiting:
                self._queue.append(pid)
                self._replies[pid] = Reply()
        self._thread.start()
        return len(waiting)

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        self._thread.join(timeout=30)

    @property
    def queued(self) -> int:
        with self._cv:
            return len(self._queue)

    def has_room(self) -> bool:
        with self._cv:
            return len(self._queue) < self.queue_limit

    def submit(self, participant_id: str) -> Reply:
        """Queue a reply (the caller checked :meth:`has_room` before committing the participant's message)."""
        with self._cv:
            current = self._replies.get(participant_id)
            if current is not None and not current.done:
                return current
            reply = self._replies[participant_id] = Reply()
            self._queue.append(participant_id)
            self._cv.notify_all()
            return reply

    def reply(self, participant_id: str) -> Reply | None:
        with self._cv:
            return self._replies.get(participant_id)

    def forget(self, participant_id: str) -> None:
        with self._cv:
            if participant_id in self._queue:
                self._queue.remove(participant_id)
            self._replies.pop(participant_id, None)

    # ---- the worker thread -------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    return
            time.sleep(self.window_s)  # let turns sent at nearly the same moment join this batch
            with self._cv:
                batch, self._queue = self._queue, []
                replies = {pid: self._replies[pid] for pid in batch}
            try:
                self._generate(replies)
            except Exception:  # never let one bad batch stop the study; each row reports its error
                log.exception("reply batch failed")
                for reply in replies.values():
                    if not reply.done:
                        reply.update(done=True, error="your partner could not reply; press retry")

    def _generate(self, replies: dict[str, Reply]) -> None:
        groups: dict[int, list[_Row]] = defaultdict(list)
        models = {}
        for pid, reply in replies.items():
            p = self.store.get(pid)
            history = self.store.messages(pid)
            if p.stage != "chat" or (history and history[-1].role == AGENT):
                reply.update(done=True, index=history[-1].idx if history else None)
                continue
            agent = self.conditions.agents[p.condition]
            prompt = self.conditions.prompt(p.task_id, history)
            groups[id(agent.chat)].append(_Row(pid, reply, prompt, agent.adapter, derive_seed(self.seed, pid, len(history)), []))
            models[id(agent.chat)] = agent.chat
        for key, rows in groups.items():
            chat = models[key]
            self.batch_sizes.append(len(rows))
            adapters = [r.adapter for r in rows]
            seeds = [r.seed for r in rows]
            streams = "on_token" in inspect.signature(getattr(chat, "generate_ids", lambda: None)).parameters
            if streams:
                stop_ids = chat.stop_ids

                def on_token(i: int, token: int, rows=rows, chat=chat, stop_ids=stop_ids) -> None:
                    if token not in stop_ids:
                        rows[i].ids.append(token)
                        rows[i].reply.update(text=chat.decode(rows[i].ids))

                outs = chat.generate_ids(
                    [chat.encode_chat(r.prompt) for r in rows], self.sampling, adapters, seeds=seeds, on_token=on_token
                )
            else:
                outs = chat.generate([r.prompt for r in rows], self.sampling, adapters, seeds=seeds)
            for row, out in zip(rows, outs):
                text = out.text.strip()
                index = self.store.add_agent_message(row.participant, text)  # committed whole, or not at all
                row.reply.update(text=text, index=index, done=True)
