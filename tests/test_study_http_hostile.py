"""The study server against hostile participants, over real HTTP: scope's own server process
(tests/study_launcher.py: uvicorn, the real app, a real SQLite file; only the agent is a scripted
stand-in) driven with httpx and, for what a well-behaved client library refuses to send (a lying
Content-Length, raw non-ASCII header bytes, invalid UTF-8), raw sockets.

Every case must get an answer below 500; at the end the server's log must hold no traceback and
no participant's whole token. The admin side: security headers, a session that signs out, and a
cookie scoped to /admin."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import httpx
import pytest
from test_study_process import ROOT, free_port, invite, start, stop, wait_reply, write_study

from scope_marl.study.app import redacted
from scope_marl.study.store import Store

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A running server: (base URL, database path, log path)."""
    folder = tmp_path_factory.mktemp("hostile")
    port, db, log = free_port(), folder / "study.sqlite", folder / "server.log"
    study = write_study(folder / "study.yaml", "slow", limits="{requests_per_minute: 600}")
    proc = start([sys.executable, str(ROOT / "tests" / "study_launcher.py"), str(study), str(db), str(port), "0.05"], port, log)
    try:
        yield f"http://127.0.0.1:{port}", db, log
    finally:
        stop(proc)


def raw(base: str, request: bytes, timeout: float = 10) -> int:
    """Send bytes as they are; the response's status code (0: the server closed without answering)."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as conn:
        conn.sendall(request)
        data = b""
        try:
            while b"\r\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
        except TimeoutError:
            return 0
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0


def at_donation(client: httpx.Client, db: Path) -> str:
    token = invite(db, 1)[0]
    client.post(f"/api/{token}/consent", json={})
    client.post(f"/api/{token}/start", json={})
    wait_reply(client, token, 1)
    client.post(f"/api/{token}/messages", json={"text": "Tell me more."})
    wait_reply(client, token, 2)
    assert client.post(f"/api/{token}/end", json={}).json()["stage"] == "donation"
    return token


def admin_key(db: Path) -> str:
    store = Store(db)
    try:
        return store.secret("admin_key")
    finally:
        store.close()


def test_hostile_requests_get_clear_refusals_never_a_500(live):
    base, db, log = live
    statuses: dict[str, int] = {}
    with httpx.Client(base_url=base, timeout=30) as client:
        token = invite(db, 1)[0]
        client.post(f"/api/{token}/consent", json={})
        client.post(f"/api/{token}/start", json={})
        wait_reply(client, token, 1)
        post = lambda name, path, **kw: statuses.__setitem__(name, client.post(path, **kw).status_code)
        get = lambda name, path, **kw: statuses.__setitem__(name, client.get(path, **kw).status_code)
        # message bodies of every wrong shape
        for name, value in {"null": None, "object": {"a": 1}, "list": [1], "number": 5, "bool": True}.items():
            post(f"text {name}", f"/api/{token}/messages", json={"text": value})
        post("not an object", f"/api/{token}/messages", json=["text"])
        post("not JSON", f"/api/{token}/messages", content=b"hello", headers={"content-type": "text/plain"})
        post("invalid UTF-8", f"/api/{token}/messages", content=b'{"text": "\xff\xfe"}')
        post("nested", f"/api/{token}/messages", content=b"[" * 5000 + b"]" * 5000)
        post("huge number", f"/api/{token}/messages", content=b'{"text": "hi", "n": ' + b"9" * 5000 + b"}")
        post("too long", f"/api/{token}/messages", json={"text": "x" * 100_000})
        post("lone surrogate", f"/api/{token}/messages", content=b'{"text": "a\\ud800b"}')
        # tokens and paths
        get("long token", "/api/" + "A" * 8000 + "/state")
        get("odd token", "/api/%00%ff%2e%2e/state")
        get("unicode token", "/s/\u00e9\u00e9\u00e9")
        get("traversal", "/static/..%2fapp.py")
        get("traversal 2", "/static/%2e%2e/%2e%2e/etc/passwd")
        get("unknown static", "/static/chat.html")
        statuses["PUT"] = client.put(f"/api/{token}/messages", json={"text": "x"}).status_code
        statuses["DELETE"] = client.delete(f"/api/{token}/state").status_code
        get("events of a guess", "/api/not-a-token/events")
        # the donation, at its stage
        donor = at_donation(client, db)
        post("donation 100k", f"/api/{donor}/donation", json={"text": "5 " * 50_000})
        post("donation amount NaN", f"/api/{donor}/donation/confirm", content=b'{"amount": NaN}')
        post("donation amount 1e309", f"/api/{donor}/donation/confirm", content=b'{"amount": 1e309}')
        post("donation amount -1", f"/api/{donor}/donation/confirm", json={"amount": -1})
        post("donation amount text", f"/api/{donor}/donation/confirm", json={"amount": "all of it"})
        # the admin, without a session
        post("admin key non-ASCII", "/admin/login", data={"key": "schl\u00fcssel"})
        post("admin key surrogate", "/admin/login", content=b"key=%ED%A0%80", headers={"content-type": "application/x-www-form-urlencoded"})
        post("invite without a session", "/admin/invite", data={"n": "5"})
        get("export without a session", "/admin/export.csv")
    # what httpx will not send
    statuses["lying Content-Length"] = raw(
        base,
        b"POST /api/" + token.encode() + b"/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(b"%x\r\n%s\r\n" % (65536, b"a" * 65536) for _ in range(32)) + b"0\r\n\r\n",
    )  # fmt: skip
    statuses["no Content-Length"] = raw(base, b"POST /api/" + token.encode() + b"/end HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    statuses["raw non-ASCII cookie"] = raw(base, "GET /admin HTTP/1.1\r\nHost: x\r\nCookie: scope_study_admin=caf\u00e9\r\n\r\n".encode())
    statuses["huge header"] = raw(base, b"GET / HTTP/1.1\r\nHost: x\r\nX-Junk: " + b"j" * 200_000 + b"\r\n\r\n")
    statuses["garbage request line"] = raw(base, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not http\r\n\r\n")

    served = {name: code for name, code in statuses.items() if code >= 500}
    assert not served, f"5xx answers: {served}"
    assert all(code in range(400, 500) for name, code in statuses.items() if name not in ("lone surrogate", "garbage request line")), (
        statuses
    )
    assert statuses["lone surrogate"] == 200 and statuses["lying Content-Length"] == 413 and statuses["no Content-Length"] == 411
    with httpx.Client(base_url=base, timeout=30) as client:
        stored = client.get(f"/api/{token}/state").json()["messages"]
    said = [m["content"] for m in stored if m["role"] == "participant"]
    assert said == ["a\ufffdb"]  # the lone surrogate cleaned; nothing of a wrong shape stored (no 'None', no repr)
    text = log.read_text()
    assert "Traceback" not in text and token not in text and donor not in text


def test_admin_pages_have_security_headers_and_a_session_that_signs_out(live):
    base, db, _ = live
    with httpx.Client(base_url=base, timeout=30) as client:
        login = client.get("/admin")
        assert login.status_code == 401
        assert login.headers["x-frame-options"] == "DENY" and "frame-ancestors 'none'" in login.headers["content-security-policy"]
        assert login.headers["cache-control"] == "no-store" and login.headers["x-content-type-options"] == "nosniff"
        signed = client.post("/admin/login", data={"key": admin_key(db)})
        cookie = signed.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/admin" in cookie and "max-age=28800" in cookie
        assert "secure" not in cookie  # plain HTTP here: a Secure cookie would never come back
        session = client.cookies.get("scope_study_admin")
        assert session and session != admin_key(db)  # the cookie is a session id, never the key
        dashboard = client.get("/admin")
        assert dashboard.status_code == 200 and "Sign out" in dashboard.text
        assert dashboard.headers["x-frame-options"] == "DENY"
        assert client.post("/admin/logout").status_code == 303
    with httpx.Client(base_url=base, timeout=30, cookies={"scope_study_admin": session}) as stale:
        assert stale.get("/admin").status_code == 401  # signed out: the old cookie no longer opens anything
        assert stale.get("/admin/export.jsonl").status_code == 401


def test_behind_an_https_proxy_the_admin_cookie_is_secure(live):
    """uvicorn trusts X-Forwarded-Proto from 127.0.0.1 (a reverse proxy on the same machine)."""
    base, db, _ = live
    with httpx.Client(base_url=base, timeout=30) as client:
        signed = client.post("/admin/login", data={"key": admin_key(db)}, headers={"x-forwarded-proto": "https"})
    assert signed.status_code == 303 and "secure" in signed.headers["set-cookie"].lower()


def test_tokens_are_cut_in_log_lines():
    assert redacted("/api/AbCdEfGhIjKlMnOp/messages") == "/api/AbCdEf…/messages"
    assert redacted("/s/AbCdEfGhIjKl") == "/s/AbCdEf…"
    assert redacted("/admin/export.csv") == "/admin/export.csv"
    assert json.dumps(redacted("/api/abc/state"))  # a short one is left as it is
