"""The rollout engine: many episodes at once, each turn batched with every other turn in flight.

Each live episode has one next speaker. A turn whose seat's model supports continuous batching
(``open_session``: the transformers backend's decoding session, a vLLM server's session of
requests in flight) joins that model's session for its
sampling settings the moment the turn is ready, and comes back the moment it finishes; the
episode's next turn then joins at once, so episodes and groups advance independently, with no
tick waiting for the slowest reply. Turns of both roles on one model share the session (adapters
mixed per row). Token-level models get their prompts from each role's :class:`StreamBuilder`
(token-in-token-out) with the conversation as the prefix-cache key, so a turn only prefills what
the other role said since. Other turns (OpenAI-compatible API models, simulators that answer
through :meth:`Simulator.respond`) go as one blocking batched call per group once no session is busy.

Environments with tools: a role's turn may call tools (``backends.tool_format`` renders the schemas
into its prompt and parses the calls back). The environment executes each call on the episode's own
state and the results enter the caller's context as ``tool`` messages (masked out of its stream);
the same role then goes on until it speaks to the other side. A call that does not parse is
answered with an error result and counted in ``Episode.tool_errors``; it never stops the batch.

When an episode ends (any status), the environment's ``finish`` scores it (rewards when it
COMPLETED, metadata always) with the per-episode state still at hand, then releases that state:
coop scores the seats' working copies there.

Rewards that depend on a whole group (tau2's variance curriculum) are set by the environment's
``group_rewards`` once every episode of the group has ended; the streams carry the final values.

Episodes end COMPLETED when the environment says so, TRUNCATED when a turn hits its token limit,
the context is full or a per-episode cap (tool calls, steps) is reached, FAILED when a backend
raises for that episode (a bad prompt is refused alone when it joins a session; a blocking batch
that raises is retried row by row, so one bad request does not take its neighbours down; a
session step that raises fails the turns in it) or the simulator's reply is empty. All are recorded. Every text is cleaned where it enters an episode (``core.text``), so an
episode can always be written.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from scope_marl.backends.base import ContextLengthError, Generation, TokenChatModel
from scope_marl.backends.seat import Seat
from scope_marl.backends.tool_format import ParsedTurn
from scope_marl.backends.tool_formats import ToolFormat, resolve_tool_format
from scope_marl.config.rollout import RolloutConfig
from scope_marl.core.seeds import derive_seed
from scope_marl.core.text import clean
from scope_marl.core.types import TOOL, Episode, EpisodeStatus, Message
from scope_marl.envs.base import AGENT, USER, Environment, Task, role_view
from scope_marl.rollout.streams import StreamBuilder
from scope_marl.simulators.base import Response, Simulator, SimulatorTurn

# A simulator that says nothing gives the agent nothing to answer and the reward nothing to read.
EMPTY_REPLY = "the simulator's reply was empty (a malformed turn)"


@dataclass
class _Live:
    """An episode in flight."""

    episode: Episode
    task: Task
    simulator: Simulator
    next_role: str
    started: float
    builders: dict[str, StreamBuilder] = field(default_factory=dict)
    state: Any = None  # the environment's per-episode state that tools act on
    tool_calls: int = 0
    waiting: bool = False  # its turn is in a decoding session
    group_index: int = 0  # the group's number in the run (unique across steps): part of every seed
    rollout: int = 0  # the episode's place in its group


@dataclass
class RolloutStats:
    episodes: int = 0
    generated_tokens: int = 0
    prefill_tokens: int = 0
    model_calls: int = 0
    seconds: float = 0.0


class RolloutEngine:
    """Plays ``group_size`` episodes per task between an agent seat and a simulator."""

    def __init__(self, env: Environment, agent: Seat, simulator: Simulator, config: RolloutConfig | None = None):
        self.threads = None  # a core.machine.ThreadGovernor to re-check between decode steps (the trainer's), or None
        self.env = env
        self.agent = agent
        self.simulator = simulator
        self.config = config or RolloutConfig()
        self.stats = RolloutStats()
        self._groups_started = 0  # groups across calls, so rotation / pools keep turning and seeds never repeat
        self._formats: dict[tuple[str, int], ToolFormat] = {}  # (role, id of the model playing it) -> its tool format

    # ---- public ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The counters that make the next run reproducible (a checkpoint saves them)."""
        return {"groups": self._groups_started}

    def load_state_dict(self, state: dict) -> None:
        self._groups_started = state["groups"]  # ("calls" of older checkpoints seeded per batch; no longer used)

    def run(self, tasks: Sequence[Task], first_group: int | None = None) -> list[Episode]:
        """Play every task ``group_size`` times. Returns the episodes in task, then rollout order.

        Groups are numbered on from the last call; ``first_group`` numbers them from there instead
        (a distributed executor gives each worker its groups' numbers, so every episode gets the
        seeds it would get locally)."""
        if first_group is not None:
            self._groups_started = first_group
        queue = deque(self._new_episodes(tasks))
        episodes = [live.episode for live in queue]
        groups: dict[str, tuple[Task, list[Episode]]] = {}
        for entry in queue:
            groups.setdefault(entry.episode.group_id, (entry.task, []))[1].append(entry.episode)
        live: list[_Live] = []
        sessions: dict[tuple, Any] = {}  # continuous-batching sessions, one per (model, sampling)
        started = time.perf_counter()
        generated_before = self.stats.generated_tokens
        bar = tqdm(total=len(episodes), unit="ep", desc="rollout", disable=not self.config.progress, leave=False)
        try:
            while queue or live:
                while queue and len(live) < self.config.max_concurrent:
                    entry = queue.popleft()
                    entry.started = time.perf_counter()
                    if self._open(entry):
                        live.append(entry)
                if self.threads is not None:
                    self.threads.recheck()  # beside other busy processes, leave them their cores (core.machine)
                self._dispatch(live, sessions)
                self._step_sessions(sessions)
                finished = [e for e in live if e.next_role == ""]
                live = [e for e in live if e.next_role != ""]
                if finished:
                    elapsed = time.perf_counter() - started
                    tokens = self.stats.generated_tokens - generated_before
                    bar.update(len(finished))
                    bar.set_postfix(ep_s=f"{bar.n / elapsed:.2f}", tok_s=f"{tokens / elapsed:.0f}")
        finally:
            bar.close()
            for session in sessions.values():  # what a session still holds goes back (states copied out, requests dropped)
                session.close()
        for task, members in groups.values():
            self._group_rewards(task, members)
        self.stats.episodes += len(episodes)
        self.stats.seconds += time.perf_counter() - started
        return episodes

    def _group_rewards(self, task: Task, members: list[Episode]) -> None:
        """The environment's rewards over a whole group (tau2's curriculum), copied into the streams."""
        try:
            self.env.group_rewards(task, members)
        except Exception as err:  # the group alone fails, as an episode the environment cannot score does
            for e in members:
                e.status, e.rewards = EpisodeStatus.FAILED, {}
                e.error = f"the environment could not score the group ({type(err).__name__}: {err})"
        for e in members:
            for role, stream in e.streams.items():
                stream.reward = e.rewards.get(role)

    def tool_format(self, entry: _Live, role: str) -> ToolFormat:
        """How ``role``'s model is shown its tools and writes its calls (``rollout.tool_format``), chosen once per model."""
        seat = self.seat_of(entry, role)
        model = seat.model if seat is not None else None
        key = (role, id(model))
        if key not in self._formats:
            setting = self.config.tool_format.agent if role == AGENT else self.config.tool_format.simulator
            self._formats[key] = resolve_tool_format(setting, model)
        return self._formats[key]

    def seat_of(self, entry: _Live, role: str) -> Seat | None:
        """The seat that generates ``role``'s turns in this episode (None: the simulator answers itself)."""
        if role == AGENT:
            return self.agent
        return entry.simulator.direct_seat()

    # ---- episode lifecycle -------------------------------------------------------------------
    def _new_episodes(self, tasks: Sequence[Task]) -> list[_Live]:
        out = []
        for task in tasks:
            index = self._groups_started
            simulator = self.simulator.for_group(index)
            group_id = f"{task.task_id}#{index}"
            self._groups_started += 1
            has_tools = any(self.env.tools(task, role) for role in self.env.roles)
            for r in range(self.config.group_size):
                episode = Episode(
                    episode_id=f"{group_id}/{r}",
                    task_id=task.task_id,
                    group_id=group_id,
                    simulator_id=simulator.simulator_id,
                    split=task.split,
                    messages=self.env.opening(task),
                    metadata={"simulator": simulator.identity()},
                    timings={"generate_s": 0.0},
                    tool_errors=0 if has_tools else None,
                )
                out.append(_Live(episode, task, simulator, self.env.first_speaker(task), 0.0, group_index=index, rollout=r))
        return out

    def _open(self, entry: _Live) -> bool:
        """Give an episode that goes live its own environment state (opened late, so at most
        ``max_concurrent`` states exist at once). False: it could not start and is recorded FAILED."""
        try:
            entry.state = self.env.start(entry.task)
            return True
        except Exception as err:
            self._end(entry, EpisodeStatus.FAILED, f"the environment could not start the task ({type(err).__name__}: {err})")
            return False

    def _end(self, entry: _Live, status: EpisodeStatus, error: str | None = None) -> None:
        episode = entry.episode
        episode.status = status
        episode.error = error
        try:
            self.env.finish(entry.task, entry.state, episode)
        except Exception as err:  # an evaluator that cannot score this conversation fails it alone
            episode.status, episode.rewards = EpisodeStatus.FAILED, {}
            episode.error = f"the environment could not score the episode ({type(err).__name__}: {err})"
        for role, builder in entry.builders.items():
            builder.model.release([(episode.episode_id, role)])
            seat = self.seat_of(entry, role)
            if seat is not None and seat.trainable and builder.stream is not None:
                builder.stream.reward = episode.rewards.get(role)
                episode.streams[role] = builder.stream
        episode.timings["total_s"] = time.perf_counter() - entry.started
        entry.next_role = ""
        entry.state = None

    @staticmethod
    def _cleaned(entry: _Live, value):
        """The boundary: ``value`` (a text, or a simulator's recorded info) made serializable, so an
        episode can always be written; replaced code points are counted in its metadata."""
        value, replaced = clean(value)
        if replaced:
            entry.episode.metadata["invalid_code_points"] = entry.episode.metadata.get("invalid_code_points", 0) + replaced
        return value

    def _record(self, entry: _Live, role: str, text: str, view: list[Message] | None, gen: Generation | None) -> None:
        """Append one message and decide whether the episode goes on."""
        text = self._cleaned(entry, text)
        tools = self.env.tools(entry.task, role)
        parsed = self.tool_format(entry, role).parse(text, f"{role}-{len(entry.episode.messages)}") if tools else None
        if parsed is not None and parsed.has_calls:
            entry.episode.messages.append(
                Message(role=role, content=parsed.content, tool_calls=parsed.calls, raw=text if text != parsed.content else None)
            )
        else:
            entry.episode.messages.append(Message(role=role, content=text))
            parsed = None
        if gen is not None and role in entry.builders:
            entry.builders[role].add_turn([*view, Message(role="assistant", content=text)], gen)
        if role == USER and parsed is None and not text.strip() and self.config.on_empty_reply == "fail":
            self._end(entry, EpisodeStatus.FAILED, EMPTY_REPLY)
        elif gen is not None and gen.finish_reason == "length" and self.config.on_turn_limit == "truncate":
            self._end(entry, EpisodeStatus.TRUNCATED, f"{role} turn hit its token limit")
        elif parsed is not None:
            self._run_tools(entry, role, parsed)
        elif self._over_steps(entry):
            pass
        elif self.env.is_done(entry.task, entry.episode.messages):
            self._end(entry, EpisodeStatus.COMPLETED)
        else:
            entry.next_role = self.env.other(role)

    def _run_tools(self, entry: _Live, role: str, parsed: ParsedTurn) -> None:
        """Execute a turn's calls in order (answering unparsable ones with an error); the caller
        speaks next, unless a cap or the environment ends the episode."""
        episode = entry.episode
        results = {call_id: (f"Error: {reason}", True, role) for call_id, reason in parsed.malformed}
        episode.tool_errors = (episode.tool_errors or 0) + len(parsed.malformed)
        for call in parsed.calls:
            entry.tool_calls += 1
            if entry.tool_calls > self.config.max_tool_calls:
                self._end(
                    entry, EpisodeStatus.TRUNCATED, f"the episode made more than max_tool_calls={self.config.max_tool_calls} tool calls"
                )
                return
            try:
                result = self.env.execute(entry.task, entry.state, role, call)
            except Exception as err:  # the environment's own failure, not the caller's: this episode only
                self._end(entry, EpisodeStatus.FAILED, f"the environment failed on {call.name} ({type(err).__name__}: {err})")
                return
            results[call.id] = (self._cleaned(entry, result.content), bool(result.error), call.requestor or role)
        order = [c.id for c in parsed.calls] + [call_id for call_id, _ in parsed.malformed]
        for call_id in sorted(order, key=lambda i: int(i.rsplit("-", 1)[1])):
            content, error, requestor = results[call_id]
            episode.messages.append(Message(role=TOOL, content=content, tool_call_id=call_id, requestor=requestor, error=error))
        if self._over_steps(entry):
            return
        if self.env.is_done(entry.task, episode.messages):
            self._end(entry, EpisodeStatus.COMPLETED)
        else:
            entry.next_role = role

    def _over_steps(self, entry: _Live) -> bool:
        """End the episode TRUNCATED once it holds ``max_steps`` messages (when a cap is set)."""
        cap = self.config.max_steps
        if cap is not None and len(entry.episode.messages) >= cap:
            self._end(entry, EpisodeStatus.TRUNCATED, f"the episode reached max_steps={cap} messages")
            return True
        return False

    # ---- turns -------------------------------------------------------------------------------
    def turn_seed(self, entry: _Live) -> int:
        """The random stream of one turn: (run seed, group, rollout, turn), whatever else shares the batch."""
        return derive_seed(self.config.seed, entry.group_index, entry.rollout, len(entry.episode.messages), bits=31)

    def _view(self, entry: _Live, role: str, system_prompt: str) -> list[Message]:
        """What ``role`` reads: its view of the conversation, in its tool format when it has tools."""
        view = role_view(entry.episode.messages, role, system_prompt)
        tools = self.env.tools(entry.task, role)
        return self.tool_format(entry, role).chat(view, tools) if tools else view

    def _dispatch(self, live: list[_Live], sessions: dict) -> None:
        """Start the turns of every episode whose next speaker is not already generating.

        Seats on a model with continuous batching (``open_session``) queue their turn in that
        model's session and go on as soon as it finishes. Other turns (API models, simulators that
        answer themselves, such as verbalized sampling) are one blocking batched call per group, made
        once no session is decoding: the group then holds every episode that will be ready for it,
        so it batches as a tick would, and its seeded draws do not depend on decoding order.
        """
        batches: dict[tuple, list[_Live]] = defaultdict(list)
        for entry in live:
            if entry.next_role == "" or entry.waiting:
                continue
            seat = self.seat_of(entry, entry.next_role)
            key = ("seat", *seat.batch_key) if seat is not None else ("simulator", id(entry.simulator))
            batches[key].append(entry)
        for key, entries in batches.items():
            seat = self.seat_of(entries[0], entries[0].next_role) if key[0] == "seat" else None
            if seat is not None and callable(getattr(seat.model, "open_session", None)):
                if key not in sessions:
                    sessions[key] = seat.model.open_session(seat.sampling)
                self._queue_turns(entries, sessions[key])
                continue
            if any(session.busy for session in sessions.values()):
                continue
            if seat is not None:
                self._seat_turns(entries)
            else:
                self._simulator_turns(entries)

    def _prepare_turns(self, entries: list[_Live]) -> list[tuple]:
        """Each entry's turn as ``(entry, role, seat, view, prompt ids or None)``; an episode whose
        prompt cannot be built or fills the context ends here."""
        rows = []
        for entry in entries:
            role = entry.next_role
            seat = self.seat_of(entry, role)
            model = seat.model
            view = self._view(entry, role, seat.system_prompt(self.env.system_prompt(entry.task, role)))
            ids = None
            if isinstance(model, TokenChatModel):
                if role not in entry.builders:
                    tools = self.env.tools(entry.task, role)
                    template_tools = self.tool_format(entry, role).template_tools(tools) if tools else None
                    entry.builders[role] = StreamBuilder(role, model, seat.adapter, template_tools)
                builder = entry.builders[role]
                try:
                    ids = builder.prompt(view)
                except Exception as err:  # a template that cannot extend the stream: this episode only
                    self._end(entry, EpisodeStatus.FAILED, f"{type(err).__name__}: {err}")
                    continue
                if len(ids) >= model.context_length:
                    self._end(entry, EpisodeStatus.TRUNCATED, f"{role} context is full ({len(ids)} tokens)")
                    continue
            rows.append((entry, role, seat, view, ids))
        return rows

    def _queue_turns(self, entries: list[_Live], session) -> None:
        for row in self._prepare_turns(entries):
            entry, role, seat = row[0], row[1], row[2]
            try:
                session.add(row[4], seat.adapter, (entry.episode.episode_id, role), self.turn_seed(entry), tag=row)
            except Exception as err:  # this prompt only (an unknown adapter, a full context)
                self._take(row, err, 0.0)
                continue
            entry.waiting = True

    def _step_sessions(self, sessions: dict) -> None:
        """One step of every busy session (a local model's packed forward; a server's short wait for
        replies); record the turns that finished, or the error of a request that failed."""
        for key, session in list(sessions.items()):
            if not session.busy:
                continue
            rows = session.tags
            clock = time.perf_counter()
            self.stats.model_calls += 1  # a step is one batched forward (or one poll of a server)
            try:
                done = session.step()
            except Exception as err:  # the model failed for the whole batch: its turns fail, a new session starts
                del sessions[key]
                for row in rows:
                    row[0].waiting = False
                    self._take(row, err, 0.0)
                continue
            share = (time.perf_counter() - clock) / len(rows)
            for row in rows:
                row[0].episode.timings["generate_s"] += share
            for row, gen in done:
                row[0].waiting = False
                self._take(row, gen, 0.0)

    def _seat_turns(self, entries: list[_Live]) -> None:
        rows = self._prepare_turns(entries)
        if not rows:
            return
        model, sampling = rows[0][2].model, rows[0][2].sampling
        token_level = isinstance(model, TokenChatModel)

        def call(batch):
            seeds = [self.turn_seed(r[0]) for r in batch]
            adapters = [r[2].adapter for r in batch]
            adapters = adapters if any(a is not None for a in adapters) else None
            if token_level:
                keys = [(r[0].episode.episode_id, r[1]) for r in batch]
                return model.generate_ids([r[4] for r in batch], sampling, adapters, cache_keys=keys, seeds=seeds)
            return model.generate([r[3] for r in batch], sampling, adapters, seeds=seeds)

        started = time.perf_counter()
        results = self._call_isolating_failures(rows, call)
        share = (time.perf_counter() - started) / len(rows)
        for row, gen in results:
            self._take(row, gen, share)

    def _take(self, row: tuple, gen: Generation | Exception, seconds: float) -> None:
        """Record one generated turn (or the error that replaced it)."""
        entry, role, _, view, _ = row
        entry.episode.timings["generate_s"] += seconds
        if isinstance(gen, ContextLengthError):  # a prompt past the model's context is never cut silently
            self._end(entry, EpisodeStatus.TRUNCATED, f"{role} context is full ({gen})")
            return
        if isinstance(gen, Exception):
            self._end(entry, EpisodeStatus.FAILED, f"{type(gen).__name__}: {gen}")
            return
        self.stats.generated_tokens += len(gen.token_ids)
        self._record(entry, role, gen.text, view, gen)

    def _simulator_turns(self, entries: list[_Live]) -> None:
        simulator = entries[0].simulator
        rows = []
        for e in entries:
            context = self._view(e, USER, self.env.system_prompt(e.task, USER))
            rule = functools.partial(self.env.normalize_user_reply, e.task)
            rows.append((e, SimulatorTurn(e.episode.episode_id, e.task, context, rule, self.env.tools(e.task, USER))))
        for (entry, _), reply in self._call_isolating_failures(rows, lambda batch: simulator.respond([t for _, t in batch])):
            if isinstance(reply, Exception):
                self._end(entry, EpisodeStatus.FAILED, f"{type(reply).__name__}: {reply}")
                continue
            if isinstance(reply, Response):
                info = self._cleaned(entry, reply.info)
                entry.episode.metadata.setdefault("simulator_turns", []).append({"message": len(entry.episode.messages), **info})
                reply = reply.reply
            self._record(entry, USER, str(reply), None, None)

    def _call_isolating_failures(self, rows: list, call) -> list[tuple]:
        """``call(rows)`` as one batch; if it raises, once per row, so only failing rows fail."""
        self.stats.model_calls += 1
        try:
            return list(zip(rows, call(rows)))
        except Exception:
            out = []
            for row in rows:
                self.stats.model_calls += 1
                try:
                    out.append((row, call([row])[0]))
                except Exception as err:
                    out.append((row, err))
            return out
