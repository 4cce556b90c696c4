"""Load on the human-study server: many participants chatting at once, and nothing lost.

Starts the real server (``scope study serve``: uvicorn, a real SQLite file) on a scripted agent, then
runs N simulated participants at once (async HTTP clients): consent, start, and M messages each, each
sent after the agent's previous reply arrived over server-sent events, then donation and survey.
The latency measured is from the POST of a participant message to the response that acknowledges it
(it is sent after the message is committed). At the end every sent message is looked up in the
database: ``lost`` counts those missing.

    python bench/study_load.py [--participants 50] [--messages 5]

Ends with: RESULT participants=50 p50_ms=... p99_ms=... lost=L
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from scope_marl.study.store import PARTICIPANT, Store

AGENT = (
    "scripted:Hello! Would you give $1 to Save the Children?|It helps children get medicine. Would you give $0.50?|Thank you for listening."
)


async def reply_arrived(client: httpx.AsyncClient, token: str) -> None:
    """Wait for the agent's reply on the events stream (the page's EventSource does the same)."""
    async with client.stream("GET", f"/api/{token}/events", timeout=120) as response:
        async for line in response.aiter_lines():
            if line.startswith("event: reply") or line.startswith("event: idle"):
                return
            if line.startswith("event: error"):
                raise RuntimeError(f"reply failed for {token[:6]}")


async def participant(client: httpx.AsyncClient, token: str, messages: int, latencies: list[float], sent: list[tuple[str, str]]) -> None:
    (await client.post(f"/api/{token}/consent", json={})).raise_for_status()
    (await client.post(f"/api/{token}/start", json={})).raise_for_status()
    await reply_arrived(client, token)
    for i in range(messages):
        text = f"message {i} from {token[:8]}: why should I give?"
        clock = time.perf_counter()
        response = await client.post(f"/api/{token}/messages", json={"text": text})
        latencies.append(time.perf_counter() - clock)
        response.raise_for_status()
        sent.append((token, text))
        await reply_arrived(client, token)
    (await client.post(f"/api/{token}/end", json={})).raise_for_status()
    (await client.post(f"/api/{token}/donation", json={"text": "I'll give $0.25"})).raise_for_status()
    (await client.post(f"/api/{token}/donation/confirm", json={"amount": 0.25})).raise_for_status()
    (await client.post(f"/api/{token}/survey", json={"answers": {"persuasive": 4, "natural": 4, "respectful": 5}})).raise_for_status()


async def run_all(base: str, tokens: list[str], messages: int) -> tuple[list[float], list[tuple[str, str]], float]:
    latencies: list[float] = []
    sent: list[tuple[str, str]] = []
    limits = httpx.Limits(max_connections=4 * len(tokens), max_keepalive_connections=2 * len(tokens))
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
        clock = time.perf_counter()
        await asyncio.gather(*(participant(client, t, messages, latencies, sent) for t in tokens))
        return latencies, sent, time.perf_counter() - clock


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def new_study(title: str, conditions: str, limits: str, tasks: int, participants: int) -> tuple[Path, Path, list[str], str]:
    """A study file (synthetic P4G tasks) and its database in a new folder, with ``participants``
    invited; (folder, database, tokens, admin key)."""
    work = Path(tempfile.mkdtemp(prefix="study-bench-"))
    (work / "study.yaml").write_text(
        f"title: {title}\nconditions:\n{conditions}env: {{name: p4g, source: synthetic, synthetic_tasks: {tasks}}}\nlimits: {limits}\n"
    )
    store = Store(work / "study.sqlite")
    try:
        return work, work / "study.sqlite", store.invite(participants), store.secret("admin_key")
    finally:
        store.close()


def start_server(work: Path, study: Path, db: Path, port: int) -> tuple[subprocess.Popen, str]:
    """``scope study serve`` in its own process group (log in WORK/server.log), once it answers; (process, base URL)."""
    log = (work / "server.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "scope_marl.cli", "study", "serve", str(study), "--db", str(db), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(base + "/", timeout=1).status_code == 200:
                return server, base
        except httpx.HTTPError:
            time.sleep(0.2)
    os.killpg(server.pid, signal.SIGTERM)
    raise SystemExit(f"the server did not start; see {work / 'server.log'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--participants", type=int, default=50)
    parser.add_argument("--messages", type=int, default=5, help="participant messages each")
    args = parser.parse_args()
    conditions = f"  - {{name: a, model: '{AGENT}'}}\n  - {{name: b, model: '{AGENT}'}}\n"
    limits = "{max_turns: 20, requests_per_minute: 600, queue: 256}"
    work, db, tokens, admin_key = new_study("Load test", conditions, limits, 50, args.participants)
    server, base = start_server(work, work / "study.yaml", db, free_port())
    try:
        latencies, sent, seconds = asyncio.run(run_all(base, tokens, args.messages))
        with httpx.Client(base_url=base) as admin:
            admin.post("/admin/login", data={"key": admin_key})
            dashboard = admin.get("/admin").text
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
    store = Store(db)
    try:
        stored = {(p.id, m.content) for p in store.participants() for m in store.messages(p.id) if m.role == PARTICIPANT}
        ids = {t: p.id for t in tokens if (p := store.find(t))}
        completed = sum(1 for p in store.participants() if p.completed)
    finally:
        store.close()
    lost = sum((ids[t], text) not in stored for t, text in sent)
    ms = sorted(x * 1000 for x in latencies)
    p50, p90, p99 = (ms[min(len(ms) - 1, int(q * len(ms)))] for q in (0.5, 0.9, 0.99))
    batching = re.search(r"generate calls (\d+), mean rows per call ([0-9.]+)", dashboard)
    print(f"{'participants':<40}{args.participants}")
    print(f"{'messages sent / acknowledged':<40}{len(sent)} / {len(latencies)}")
    print(f"{'completed the survey':<40}{completed}")
    print(f"{'wall time (s)':<40}{seconds:.1f}")
    print(f"{'ack latency ms p50 / p90 / p99 / max':<40}{p50:.1f} / {p90:.1f} / {p99:.1f} / {ms[-1]:.1f}  (mean {statistics.mean(ms):.1f})")
    if batching:
        print(f"{'generate calls, mean rows per call':<40}{batching.group(1)}, {batching.group(2)}")
    print(f"{'messages missing from the database':<40}{lost}")
    print(f"RESULT participants={args.participants} p50_ms={p50:.1f} p99_ms={p99:.1f} lost={lost}")


if __name__ == "__main__":
    main()
