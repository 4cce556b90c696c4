"""The study server as a real process: SIGKILL mid-conversation, and a participant in headless Chromium.

Both start the real server (uvicorn in a subprocess, a real SQLite file). The crash test's agent is a
scripted model that takes a moment per reply (tests/study_launcher.py), so the kill lands while a
reply is being generated; the browser test runs ``scope study serve`` itself.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the study extra is not installed: pip install -e '.[study]'")
import httpx

from scope_marl.study.store import Store

pytestmark = pytest.mark.integration  # the real server in a subprocess, Chromium

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_study(path: Path, model: str, **extra: str) -> Path:
    lines = [
        "title: Process test",
        "conditions:",
        f"  - {{name: only, model: '{model}'}}",
        "env: {name: p4g, source: synthetic, synthetic_tasks: 20}",
        *[f"{k}: {v}" for k, v in extra.items()],
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def start(command: list[str], port: int, log: Path) -> subprocess.Popen:
    handle = log.open("ab")
    proc = subprocess.Popen(command, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"the server did not answer within 60 s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def invite(db: Path, n: int) -> list[str]:
    store = Store(db)
    try:
        return store.invite(n)
    finally:
        store.close()


def wait_reply(client: httpx.Client, token: str, agent_messages: int, timeout: float = 30) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        state = client.get(f"/api/{token}/state").json()
        if sum(m["role"] == "agent" for m in state["messages"]) >= agent_messages and not state["waiting"]:
            return state
        time.sleep(0.1)
    raise AssertionError(f"no reply within {timeout} s: {state}")


def test_sigkill_mid_reply_loses_no_committed_message_and_the_participant_continues(tmp_path):
    port, db, log = free_port(), tmp_path / "study.sqlite", tmp_path / "server.log"
    study = write_study(tmp_path / "study.yaml", "slow")
    a, b = invite(db, 2)
    command = [sys.executable, str(ROOT / "tests" / "study_launcher.py"), str(study), str(db), str(port), "1.5"]
    proc = start(command, port, log)
    try:
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
        for token in (a, b):
            client.post(f"/api/{token}/consent", json={})
            client.post(f"/api/{token}/start", json={})
        wait_reply(client, a, 1)
        wait_reply(client, b, 1)
        client.post(f"/api/{b}/messages", json={"text": "B's committed message"})
        wait_reply(client, b, 2)
        ack = client.post(f"/api/{a}/messages", json={"text": "A asks a question"})
        assert ack.status_code == 200 and ack.json()["stored"]
        time.sleep(0.4)  # the reply is being generated now (1.5 s)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        with sqlite3.connect(db) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        proc = start(command, port, log)
        assert "resumed 1 open conversation" in log.read_text()
        state = client.get(f"/api/{a}/state").json()
        assert [(m["role"], m["content"]) for m in state["messages"]][:2] == [
            ("agent", "Reply 0: would you give $1 to Save the Children?"),
            ("participant", "A asks a question"),
        ]
        state = wait_reply(client, a, 2)  # the cut reply is generated again, whole
        assert state["messages"][2] == {"index": 2, "role": "agent", "content": "Reply 1: would you give $1 to Save the Children?"}
        assert client.post(f"/api/{a}/messages", json={"text": "A goes on"}).status_code == 200
        state = wait_reply(client, a, 3)
        assert [m["role"] for m in state["messages"]] == ["agent", "participant"] * 2 + ["agent"]
        b_state = client.get(f"/api/{b}/state").json()
        assert [m["content"] for m in b_state["messages"]][1] == "B's committed message"
    finally:
        stop(proc)
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT content FROM messages WHERE role = 'agent'").fetchall()
    assert all(r[0].endswith("Save the Children?") for r in rows)  # no reply was ever stored half-written


def test_a_participant_completes_the_study_in_headless_chromium(tmp_path):
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {CHROMIUM} is missing: apt-get install --no-install-recommends chromium chromium-driver")
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium); CI installs it and runs this test")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is part of the study extra")
    port, db, log = free_port(), tmp_path / "study.sqlite", tmp_path / "server.log"
    agent = "scripted:Hi! I am helping Save the Children this week. Would you give $1 of your payment?|That is a fair question. $1 buys a week of clean water for a child. Would you give $0.50?"
    study = write_study(tmp_path / "study.yaml", agent)
    token = invite(db, 1)[0]
    proc = start([sys.executable, "-m", "scope_marl.cli", "study", "serve", str(study), "--db", str(db), "--port", str(port)], port, log)
    dialogs: list[str] = []
    hostile = "<script>window.__xss = 1</script><img src=x onerror=\"alert('xss')\"> Why should I give?"
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=CHROMIUM,
                args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--no-first-run"],
            )
            page = browser.new_page(viewport={"width": 900, "height": 900})
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(f"http://127.0.0.1:{port}/s/{token}")
            page.click("#agree")
            sync_api.expect(page.locator("#card-text")).to_contain_text("Save the Children")
            page.click("#start")
            sync_api.expect(page.locator("#messages li.agent:not(.pending)")).to_have_count(1, timeout=20_000)
            page.fill("#text", hostile)
            page.click("#send")
            sync_api.expect(page.locator("#messages li.agent:not(.pending)")).to_have_count(2, timeout=20_000)
            assert page.locator("#messages li.participant").inner_text() == hostile  # shown as text
            assert page.evaluate("window.__xss") is None and page.locator("#messages img").count() == 0
            page.fill("#text", "Fifty cents sounds fine.")
            shot = Path(os.environ.get("SCOPE_STUDY_SCREENSHOT", tmp_path / "chat.png"))
            page.screenshot(path=str(shot), full_page=True)
            page.click("#end")
            page.fill("#donation-text", "I'll give fifty cents.")
            page.click("#donation-form button")
            sync_api.expect(page.locator("#donation-read")).to_contain_text("$0.50")
            page.click("#confirm-form button")
            for question in ("persuasive", "natural", "respectful"):
                page.check(f"input[name={question}][value='5']")
            page.click("#survey-form button")
            sync_api.expect(page.locator("#code")).to_have_text(__import__("re").compile(r"^[0-9A-F]{8}$"))
            browser.close()
    finally:
        stop(proc)
    assert dialogs == []  # the hostile message never ran
    store = Store(db)
    try:
        record = store.records()[0]
    finally:
        store.close()
    assert record["stage"] == "done" and record["donation"] == 0.5 and record["messages"][1]["content"] == hostile
    assert record["answers"] == {"persuasive": "5", "natural": "5", "respectful": "5"}
