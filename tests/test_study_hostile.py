"""The study app against hostile input (FastAPI's TestClient on a real SQLite file): every refusal is a
clear 4xx, never a 500, and nothing malformed is stored. Faults found by a black-box trial."""

from __future__ import annotations

import asyncio
import json

import pytest
from test_study import server, study, to_chat, wait_for_reply  # noqa: F401  (the fixture and helpers)

from scope_marl.study.app import BodyLimit, whole_number
from scope_marl.study.store import csv_text


def test_non_ascii_admin_keys_and_cookies_are_refused_not_a_500(server):  # noqa: F811
    _, client = server()
    assert client.post("/admin/login", data={"key": "schlüssel"}).status_code == 403
    assert (
        client.post("/admin/login", content=b"key=%ED%A0%80", headers={"content-type": "application/x-www-form-urlencoded"}).status_code
        == 403
    )
    cookie = {b"cookie": "scope_study_admin=café".encode()}  # raw bytes: the client library itself refuses non-ASCII
    assert client.get("/admin", headers=cookie).status_code == 401
    assert client.get("/admin/export.csv", headers=cookie).status_code == 401


def test_digits_that_are_not_whole_numbers_are_refused(server):  # noqa: F811
    s, client = server()
    assert [whole_number(v) for v in ("3", 3, "²", "٣", True, "3.0", " 3", None)] == [3, 3, None, None, None, None, None, None]
    client.post("/admin/login", data={"key": s.store.secret("admin_key")})
    assert client.post("/admin/invite", data={"n": "²"}).status_code == 400
    token = s.store.invite(1)[0]
    to_chat(client, token)
    client.post(f"/api/{token}/end", json={})
    client.post(f"/api/{token}/donation", json={"text": "I give $1"})
    client.post(f"/api/{token}/donation/confirm", json={"amount": 1})
    answers = {q.id: "²" for q in s.config.survey if q.kind == "likert"}
    response = client.post(f"/api/{token}/survey", json={"answers": answers})
    assert response.status_code == 400 and "whole number" in response.json()["error"]


@pytest.mark.parametrize("text", [None, {"a": 1}, ["hi"], 5, True])
def test_a_message_that_is_not_text_is_refused_and_nothing_stored(server, text):  # noqa: F811
    s, client = server()
    token = s.store.invite(1)[0]
    to_chat(client, token)
    before = client.get(f"/api/{token}/state").json()["messages"]
    response = client.post(f"/api/{token}/messages", json={"text": text})
    assert response.status_code == 400 and response.json()["error"] == "'text' must be text"
    assert client.get(f"/api/{token}/state").json()["messages"] == before


def test_deeply_nested_json_is_refused_as_not_json(server):  # noqa: F811
    s, client = server()
    token = s.store.invite(1)[0]
    to_chat(client, token)
    deep = "[" * 5000 + "]" * 5000
    response = client.post(f"/api/{token}/messages", content=deep.encode(), headers={"content-type": "application/json"})
    assert response.status_code == 400 and "not JSON" in response.json()["error"]


def test_a_lone_surrogate_is_cleaned_where_it_enters_and_the_message_stored(server):  # noqa: F811
    s, client = server()
    token = s.store.invite(1)[0]
    to_chat(client, token)
    response = client.post(f"/api/{token}/messages", content=b'{"text": "hi \\ud800 there"}', headers={"content-type": "application/json"})
    assert response.status_code == 200
    state = wait_for_reply(client, token)
    assert [m["content"] for m in state["messages"] if m["role"] == "participant"] == ["hi \ufffd there"]


def test_the_body_limit_counts_the_bytes_actually_sent_not_the_content_length():
    """A chunked body under a false Content-Length: the middleware reads at most the limit + 1 bytes."""
    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append((await receive())["body"])

    async def run(chunks, length):
        queue = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

        async def receive():
            return queue.pop(0)

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/api/t/messages", "headers": [(b"content-length", length)]}
        await BodyLimit(app, 1024)(scope, receive, send)

    asyncio.run(run([b"x" * 600] * 4000, b"20"))  # 2.4 MB announced as 20 bytes
    assert sent[0]["status"] == 413 and not reached
    asyncio.run(run([b'{"text": ', b'"hi"}'], b"15"))
    assert reached == [b'{"text": "hi"}'], "a small chunked body reaches the app whole"


def test_a_long_donation_statement_is_refused_before_the_parser_runs(server):  # noqa: F811
    s, client = server()
    token = s.store.invite(1)[0]
    to_chat(client, token)
    client.post(f"/api/{token}/messages", json={"text": "Tell me more."})
    wait_for_reply(client, token)
    assert client.post(f"/api/{token}/end", json={}).json()["stage"] == "donation"
    response = client.post(f"/api/{token}/donation", json={"text": "5 " * 500})
    assert response.status_code == 400 and "at most 300 characters" in response.json()["error"]
    assert client.post(f"/api/{token}/donation", json={"text": "I give $0.50"}).json()["donation"]["amount"] == 0.5


def test_csv_cells_that_a_spreadsheet_would_run_as_formulas_are_prefixed():
    records = [{"token_hash": "h", "condition": '=HYPERLINK("x")', "answers": {"comment": "@SUM(A1)", "other": "+1", "plain": "fine"}}]
    columns = json.loads(json.dumps(records))[0]
    from scope_marl.study import store

    row = {c: columns.get(c, "") for c in store.CSV_COLUMNS} | {"condition": '=HYPERLINK("x")', "answers": columns["answers"]}
    text = csv_text([row], ["comment", "other", "plain"])
    assert "'=HYPERLINK" in text and "'@SUM(A1)" in text and "'+1" in text and ",fine" in text
