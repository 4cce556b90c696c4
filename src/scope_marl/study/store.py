"""The study's storage: one SQLite file in WAL mode, every change one committed transaction.

Durability rules the server relies on:

- a participant's message is committed before its reply is generated, and the agent's message only
  once it is complete, so a crash leaves either no reply (regenerated on restart) or a whole one;
- a conversation whose last word is the participant's is "waiting for the agent": :meth:`Store.waiting`
  lists them, which is how a restarted server resumes every open conversation;
- tokens are stored only as their SHA-256, so the database alone opens no participant's link;
- withdrawing deletes the participant's messages, donation and answers; the token stays, marked
  withdrawn, so it cannot start again.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import random
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from scope_marl.core import files

PARTICIPANT, AGENT = "participant", "agent"
STAGES = ("consent", "card", "chat", "donation", "survey", "done", "withdrawn")

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS participants (
    id TEXT PRIMARY KEY,            -- the first 16 hex digits of sha256(token): what exports and reports show
    token_hash TEXT UNIQUE NOT NULL,
    created REAL NOT NULL,
    condition TEXT, task_id TEXT,
    consented REAL, started REAL, ended REAL,
    donation_text TEXT, donation REAL, confirmed REAL,
    completed REAL, code TEXT, withdrawn REAL
);
CREATE TABLE IF NOT EXISTS messages (
    participant TEXT NOT NULL REFERENCES participants(id),
    idx INTEGER NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (participant, idx)
);
CREATE TABLE IF NOT EXISTS answers (
    participant TEXT NOT NULL REFERENCES participants(id),
    question TEXT NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (participant, question)
);
"""


class Refused(Exception):
    """A request the study cannot take in the participant's current state; the message says why and what to do."""

    def __init__(self, message: str, status: int = 409):
        super().__init__(message)
        self.status = status


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class Participant:
    id: str
    created: float
    condition: str | None
    task_id: str | None
    consented: float | None
    started: float | None
    ended: float | None
    donation_text: str | None
    donation: float | None
    confirmed: float | None
    completed: float | None
    code: str | None
    withdrawn: float | None

    @property
    def stage(self) -> str:
        if self.withdrawn:
            return "withdrawn"
        if self.completed:
            return "done"
        if self.confirmed is not None:
            return "survey"
        if self.ended:
            return "donation"
        if self.started:
            return "chat"
        if self.consented:
            return "card"
        return "consent"


@dataclass
class StoredMessage:
    idx: int
    role: str
    content: str
    created: float


def choose(counts: dict[str, int], rng: random.Random) -> str:
    """The least-filled name (ties broken by ``rng``): balanced assignment, one participant at a time."""
    low = min(counts.values())
    return rng.choice(sorted(name for name, n in counts.items() if n == low))


class Store:
    """All reads and writes of one study database. Thread-safe: one connection behind a lock."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10.0)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.RLock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a committed message survives a power loss, not only a crash
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE: it holds the write lock from the start, so a check
        and the write it guards cannot interleave with another process's)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # ---- meta and invitations -----------------------------------------------------------------
    def secret(self, key: str) -> str:
        """A random secret kept in the database (the admin key), made on first use."""
        with self.transaction() as db:
            row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
            if row:
                return row["value"]
            value = secrets.token_urlsafe(24)
            db.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, value))
            return value

    def invite(self, n: int) -> list[str]:
        """``n`` new participant tokens (192 random bits each). Only their hashes are stored: keep the links."""
        tokens = [secrets.token_urlsafe(24) for _ in range(n)]
        now = time.time()
        with self.transaction() as db:
            db.executemany(
                "INSERT INTO participants (id, token_hash, created) VALUES (?, ?, ?)",
                [(token_hash(t)[:16], token_hash(t), now) for t in tokens],
            )
        return tokens

    # ---- reading --------------------------------------------------------------------------------
    def find(self, token: str) -> Participant | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM participants WHERE token_hash = ?", (token_hash(token),)).fetchone()
        return _participant(row) if row else None

    def get(self, participant_id: str) -> Participant:
        with self._lock:
            row = self._db.execute("SELECT * FROM participants WHERE id = ?", (participant_id,)).fetchone()
        return _participant(row)

    def messages(self, participant_id: str) -> list[StoredMessage]:
        with self._lock:
            rows = self._db.execute(
                "SELECT idx, role, content, created FROM messages WHERE participant = ? ORDER BY idx", (participant_id,)
            ).fetchall()
        return [StoredMessage(**dict(r)) for r in rows]

    def answers(self, participant_id: str) -> dict[str, str]:
        with self._lock:
            rows = self._db.execute("SELECT question, value FROM answers WHERE participant = ?", (participant_id,)).fetchall()
        return {r["question"]: r["value"] for r in rows}

    def participants(self) -> list[Participant]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM participants ORDER BY created, id").fetchall()
        return [_participant(r) for r in rows]

    def waiting(self) -> list[str]:
        """Conversations in progress whose next word is the agent's (none yet, or the participant spoke last)."""
        with self._lock:
            rows = self._db.execute(
                """SELECT p.id FROM participants p
                   WHERE p.started IS NOT NULL AND p.ended IS NULL AND p.withdrawn IS NULL
                     AND COALESCE((SELECT role FROM messages m WHERE m.participant = p.id ORDER BY idx DESC LIMIT 1), ?) = ?
                   ORDER BY p.started""",
                (PARTICIPANT, PARTICIPANT),
            ).fetchall()
        return [r["id"] for r in rows]

    def progress(self, conditions: Sequence[str]) -> dict[str, dict[str, int]]:
        """Per condition: assigned (not withdrawn), in progress, completed; and the withdrawn total under ``_withdrawn``."""
        out = {c: {"assigned": 0, "in_progress": 0, "completed": 0} for c in conditions}
        withdrawn = invited = 0
        for p in self.participants():
            invited += 1
            if p.withdrawn:
                withdrawn += 1
            elif p.condition in out:
                out[p.condition]["assigned"] += 1
                out[p.condition]["completed" if p.completed else "in_progress"] += 1
        out["_all"] = {"invited": invited, "withdrawn": withdrawn}
        return out

    # ---- the participant's path ----------------------------------------------------------------
    def _current(self, db: sqlite3.Connection, participant_id: str, stage: str) -> Participant:
        p = _participant(db.execute("SELECT * FROM participants WHERE id = ?", (participant_id,)).fetchone())
        if p.stage != stage:
            raise Refused(f"this step belongs to the {stage} page, but you are at the {p.stage} page; reload the page to continue")
        return p

    def consent(self, participant_id: str, conditions: Sequence[str], tasks: Sequence[str], seed: int) -> Participant:
        """Record consent and assign a condition (the least-filled among participants not withdrawn) and a
        task card (the least-used within that condition), in one transaction."""
        with self.transaction() as db:
            self._current(db, participant_id, "consent")
            counts = dict.fromkeys(conditions, 0)
            for row in db.execute(
                "SELECT condition, COUNT(*) AS n FROM participants WHERE withdrawn IS NULL AND condition IS NOT NULL GROUP BY condition"
            ):
                if row["condition"] in counts:
                    counts[row["condition"]] = row["n"]
            rng = random.Random(f"{seed}:{participant_id}")
            condition = choose(counts, rng)
            used = dict.fromkeys(tasks, 0)
            for row in db.execute(
                "SELECT task_id, COUNT(*) AS n FROM participants WHERE withdrawn IS NULL AND condition = ? GROUP BY task_id", (condition,)
            ):
                if row["task_id"] in used:
                    used[row["task_id"]] = row["n"]
            task = choose(used, rng)
            db.execute(
                "UPDATE participants SET consented = ?, condition = ?, task_id = ? WHERE id = ?",
                (time.time(), condition, task, participant_id),
            )
        return self.get(participant_id)

    def start(self, participant_id: str) -> None:
        with self.transaction() as db:
            self._current(db, participant_id, "card")
            db.execute("UPDATE participants SET started = ? WHERE id = ?", (time.time(), participant_id))

    def add_participant_message(self, participant_id: str, text: str, max_turns: int, deadline_s: float) -> int:
        """Commit the participant's message; refused while a reply is pending or past the turn or time limit."""
        with self.transaction() as db:
            p = self._current(db, participant_id, "chat")
            last = db.execute(
                "SELECT idx, role FROM messages WHERE participant = ? ORDER BY idx DESC LIMIT 1", (participant_id,)
            ).fetchone()
            if last is None or last["role"] == PARTICIPANT:
                raise Refused("your partner is still writing; wait for the reply, then send your message", status=409)
            turns = db.execute(
                "SELECT COUNT(*) FROM messages WHERE participant = ? AND role = ?", (participant_id, PARTICIPANT)
            ).fetchone()[0]
            if turns >= max_turns:
                raise Refused(f"this conversation has reached its {max_turns} messages; please end the conversation", status=409)
            if time.time() - (p.started or 0.0) > deadline_s:
                raise Refused("the time for this conversation is up; please end the conversation", status=409)
            idx = last["idx"] + 1
            db.execute(
                "INSERT INTO messages (participant, idx, role, content, created) VALUES (?, ?, ?, ?, ?)",
                (participant_id, idx, PARTICIPANT, text, time.time()),
            )
        return idx

    def add_agent_message(self, participant_id: str, text: str) -> int | None:
        """Commit a complete agent reply, if the conversation still waits for one (else None: it ended or was withdrawn)."""
        with self.transaction() as db:
            p = _participant(db.execute("SELECT * FROM participants WHERE id = ?", (participant_id,)).fetchone())
            last = db.execute(
                "SELECT idx, role FROM messages WHERE participant = ? ORDER BY idx DESC LIMIT 1", (participant_id,)
            ).fetchone()
            if p.stage != "chat" or (last is not None and last["role"] == AGENT):
                return None
            idx = 0 if last is None else last["idx"] + 1
            db.execute(
                "INSERT INTO messages (participant, idx, role, content, created) VALUES (?, ?, ?, ?, ?)",
                (participant_id, idx, AGENT, text, time.time()),
            )
        return idx

    def end(self, participant_id: str) -> None:
        with self.transaction() as db:
            self._current(db, participant_id, "chat")
            n = db.execute("SELECT COUNT(*) FROM messages WHERE participant = ? AND role = ?", (participant_id, PARTICIPANT)).fetchone()[0]
            if n == 0:
                raise Refused("send at least one message before you end the conversation", status=409)
            db.execute("UPDATE participants SET ended = ? WHERE id = ?", (time.time(), participant_id))

    def state_donation(self, participant_id: str, text: str, amount: float | None) -> None:
        with self.transaction() as db:
            self._current(db, participant_id, "donation")
            db.execute("UPDATE participants SET donation_text = ?, donation = ? WHERE id = ?", (text, amount, participant_id))

    def confirm_donation(self, participant_id: str, amount: float) -> None:
        with self.transaction() as db:
            p = self._current(db, participant_id, "donation")
            if p.donation_text is None:
                raise Refused("state your donation in your own words first", status=409)
            db.execute("UPDATE participants SET donation = ?, confirmed = ? WHERE id = ?", (amount, time.time(), participant_id))

    def complete(self, participant_id: str, answers: dict[str, str]) -> str:
        """Store the survey answers and finish; returns the completion code."""
        code = secrets.token_hex(4).upper()
        with self.transaction() as db:
            self._current(db, participant_id, "survey")
            db.executemany(
                "INSERT INTO answers (participant, question, value) VALUES (?, ?, ?)", [(participant_id, q, v) for q, v in answers.items()]
            )
            db.execute("UPDATE participants SET completed = ?, code = ? WHERE id = ?", (time.time(), code, participant_id))
        return code

    def withdraw(self, participant_id: str) -> None:
        """Delete everything the participant wrote or chose; the token stays, marked withdrawn."""
        with self.transaction() as db:
            p = _participant(db.execute("SELECT * FROM participants WHERE id = ?", (participant_id,)).fetchone())
            if p.stage == "withdrawn":
                return
            db.execute("DELETE FROM messages WHERE participant = ?", (participant_id,))
            db.execute("DELETE FROM answers WHERE participant = ?", (participant_id,))
            db.execute(
                """UPDATE participants SET condition = NULL, task_id = NULL, consented = NULL, started = NULL, ended = NULL,
                   donation_text = NULL, donation = NULL, confirmed = NULL, completed = NULL, code = NULL, withdrawn = ? WHERE id = ?""",
                (time.time(), participant_id),
            )

    # ---- export ---------------------------------------------------------------------------------
    def records(self, include_incomplete: bool = True) -> list[dict]:
        """Every participant not withdrawn with their conversation and answers (what exports and reports read)."""
        out = []
        for p in self.participants():
            if p.withdrawn or p.condition is None or (not include_incomplete and not p.completed):
                continue
            messages = self.messages(p.id)
            out.append(
                {
                    "participant": p.id,
                    "condition": p.condition,
                    "task_id": p.task_id,
                    "stage": p.stage,
                    "started": p.started,
                    "ended": p.ended,
                    "donation_text": p.donation_text,
                    "donation": p.donation if p.confirmed is not None else None,
                    "completed": p.completed,
                    "participant_turns": sum(m.role == PARTICIPANT for m in messages),
                    "messages": [{"role": m.role, "content": m.content, "created": m.created} for m in messages],
                    "answers": self.answers(p.id),
                }
            )
        return out

    def export(self, out_dir: str | Path, questions: Sequence[str] = ()) -> tuple[Path, Path]:
        """``participants.jsonl`` (everything) and ``participants.csv`` (one row each, answers as columns), atomically."""
        out_dir = Path(out_dir)
        records = self.records()
        jsonl = out_dir / "participants.jsonl"
        with files.atomic_file(jsonl) as handle:
            for r in records:
                handle.write(json.dumps(r, ensure_ascii=False) + "\n")
        table = files.write_text(out_dir / "participants.csv", csv_text(records, questions))
        return jsonl, table


CSV_COLUMNS = ["participant", "condition", "task_id", "stage", "donation", "participant_turns", "started", "ended", "completed"]


def csv_text(records: Sequence[dict], questions: Sequence[str] = ()) -> str:
    """One row per participant record, survey answers as ``q_ID`` columns."""
    names = sorted({q for r in records for q in r["answers"]} | set(questions))
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS + [f"q_{n}" for n in names])
    for r in records:
        writer.writerow([spreadsheet_safe(v) for v in [r[c] for c in CSV_COLUMNS] + [r["answers"].get(n, "") for n in names]])
    return buffer.getvalue()


def spreadsheet_safe(value):
    """A cell a spreadsheet shows as text: one starting with = + - @ (or a tab / carriage return) would
    run as a formula when a researcher opens the export, so it gets a leading ' (OWASP's advice)."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def _participant(row: sqlite3.Row) -> Participant:
    return Participant(**{k: row[k] for k in Participant.__dataclass_fields__})
