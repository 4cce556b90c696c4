"""The study's web server: FastAPI routes for participants and the admin, with every limit enforced here.

A participant's link is ``/s/TOKEN``; the page it loads is static and talks to ``/api/TOKEN/...``.
Every route finds the participant by the token in its own path, so one token never reaches another
conversation. Refusals are clear messages (JSON for the page's script, HTML for a browser), and no
stack trace ever leaves the server (it goes to the server's log).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import multiprocessing
import re
import secrets
import threading
import time
from collections import defaultdict, deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from urllib.parse import parse_qs, quote

try:
    from fastapi import FastAPI, Request
    from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
    from sse_starlette.sse import EventSourceResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError as err:
    raise ImportError(f"the study web app needs the study extra ({err.name} is missing): pip install 'scope-marl[study]'") from err

from scope_marl.config.study import StudyConfig
from scope_marl.core.text import clean_text
from scope_marl.envs.p4g.donation import PAYMENT, parse_donation
from scope_marl.study import pages
from scope_marl.study.agents import Conditions
from scope_marl.study.replies import ReplyWorker
from scope_marl.study.store import PARTICIPANT, Participant, Refused, Store, csv_text

log = logging.getLogger("scope_marl.study")
ADMIN_COOKIE = "scope_study_admin"
# The participant page loads only its own script and style: even a markup bug could not run injected code.
CSP = "default-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"


class RateLimiter:
    """At most ``per_minute`` requests per key in any 60-second window."""

    def __init__(self, per_minute: int):
        self.per_minute = per_minute
        self._seen: dict[str, deque] = defaultdict(deque)
        self._lock = threading.Lock()  # routes run on a thread pool

    def allow(self, key: str) -> bool:
        now = time.monotonic()
        with self._lock:
            seen = self._seen[key]
            while seen and now - seen[0] > 60.0:
                seen.popleft()
            if len(seen) >= self.per_minute:
                return False
            seen.append(now)
            return True


class BodyLimit:
    """Refuses a request body over ``max_bytes`` (ASGI middleware): from its Content-Length before any of it is
    read, and again on the bytes actually received (a chunked body, or one whose Content-Length lies), which
    are read here, at most ``max_bytes`` + 1 of them, and handed to the app whole."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] in ("POST", "PUT", "PATCH"):
            headers = dict(scope["headers"])
            length = headers.get(b"content-length")
            if length is None or not length.isdigit():
                return await _refuse(scope, send, 411, "send the request with a Content-Length header")
            if int(length) > self.max_bytes:
                return await _refuse(
                    scope, send, 413, f"the request is too large ({int(length):,} bytes; at most {self.max_bytes:,}); nothing was stored"
                )
            body, more = b"", True
            while more:
                message = await receive()
                if message["type"] != "http.request":  # the client went away
                    return None
                body += message.get("body", b"")
                more = message.get("more_body", False)
                if len(body) > self.max_bytes:
                    return await _refuse(
                        scope, send, 413, f"the request is too large (at most {self.max_bytes:,} bytes); nothing was stored"
                    )
            replayed = False

            async def receive_read():
                nonlocal replayed
                if replayed:
                    return await receive()
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}

            return await self.app(scope, receive_read, send)
        return await self.app(scope, receive, send)


class SecurityHeaders:
    """Headers every response gets unless its route set them (ASGI middleware): the CSP above (no
    framing, only the server's own scripts and styles), X-Frame-Options for older browsers, no MIME
    sniffing, no Referer (it would carry a participant's link); admin pages are never cached."""

    HEADERS = (
        (b"content-security-policy", CSP.encode()),
        (b"x-frame-options", b"DENY"),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
    )

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        extra = [*self.HEADERS, *([(b"cache-control", b"no-store")] if scope["path"].startswith("/admin") else [])]

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                message = {**message, "headers": [*message.get("headers", []), *((n, v) for n, v in extra if n not in present)]}
            await send(message)

        return await self.app(scope, receive, send_with_headers)


ADMIN_SESSION_SECONDS = 8 * 3600  # an admin signs in again after this, or after the server restarts


class AdminSessions:
    """Signed-in admins: a random session id per sign-in (the cookie), kept here as its hash with an
    expiry; signing out or a restart ends it. The admin key itself is never a cookie."""

    def __init__(self, seconds: float = ADMIN_SESSION_SECONDS):
        self.seconds = seconds
        self._expiry: dict[bytes, float] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _key(session: str) -> bytes:
        return hashlib.sha256(session.encode("utf-8", "backslashreplace")).digest()

    def start(self) -> str:
        session = secrets.token_urlsafe(32)
        now = time.monotonic()
        with self._lock:
            self._expiry = {k: t for k, t in self._expiry.items() if t > now}  # forget expired ones
            self._expiry[self._key(session)] = now + self.seconds
        return session

    def valid(self, session: str) -> bool:
        with self._lock:
            expiry = self._expiry.get(self._key(session))
        return expiry is not None and time.monotonic() < expiry

    def end(self, session: str) -> None:
        with self._lock:
            self._expiry.pop(self._key(session), None)


_TOKEN_IN_PATH = re.compile(r"^/(s|api)/([^/]{6})[^/]*")


def redacted(path: str) -> str:
    """A request path for the log: a participant's token cut to its first 6 characters (the database
    keeps only hashes of tokens, so the log must not hold them whole)."""
    return _TOKEN_IN_PATH.sub(lambda m: f"/{m.group(1)}/{m.group(2)}…", path)


DONATION_CHARS = 300  # a donation statement; the parser's time grows with the square of its length


class DonationParser:
    """Donation statements parsed in a process of their own, one at a time. Parsing is pure Python
    and holds the GIL: on the event loop it stalls everyone, and even on threads eight worst-case
    statements left GET / waiting 0.2-0.7 s behind them (bench/study_hostile.py). The process starts
    at the first statement (about 0.4 s) and is started again if it dies."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _current(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                # spawn, not fork: the server process has threads (the reply worker, torch's)
                self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
            return self._pool

    async def parse(self, text: str) -> float | None:
        for attempt in range(2):
            pool = self._current()
            try:
                return await asyncio.wrap_future(pool.submit(parse_donation, text))
            except BrokenProcessPool:
                with self._lock:
                    if self._pool is pool:
                        self._pool = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def same_secret(given: str, secret: str) -> bool:
    """Constant-time comparison of what a client sent with a secret; any text (``hmac.compare_digest``
    raises on non-ASCII str, so both are compared as UTF-8 bytes, lone surrogates escaped)."""
    return hmac.compare_digest(given.encode("utf-8", "backslashreplace"), secret.encode("utf-8", "backslashreplace"))


def whole_number(value) -> int | None:
    """A JSON int or a string of ASCII digits ("²" and "٣" are digits to ``str.isdigit`` but not to ``int``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None


async def _refuse(scope, send, status: int, message: str) -> None:
    is_api = scope["path"].startswith("/api/")
    body = json.dumps({"error": message}).encode() if is_api else pages.refusal("Request refused", message).encode()
    kind = b"application/json" if is_api else b"text/html; charset=utf-8"
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def create_app(config: StudyConfig, store: Store, conditions: Conditions, worker: ReplyWorker) -> FastAPI:
    limits = config.limits
    app = FastAPI(title=config.title, docs_url=None, redoc_url=None, openapi_url=None)
    per_token = RateLimiter(limits.requests_per_minute)
    admin_attempts = RateLimiter(10)
    admin_key = store.secret("admin_key")
    sessions = AdminSessions()
    donations = app.state.donations = DonationParser()
    static = {name: pages.static_text(name) for name in ("chat.html", "chat.js", "style.css")}

    # ---- errors: a clear message, never a trace ----------------------------------------------------
    def refuse(request: Request, status: int, message: str, title: str = "Request refused") -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": message}, status_code=status)
        return HTMLResponse(pages.refusal(title, message), status_code=status)

    @app.exception_handler(Refused)
    async def _refused(request: Request, err: Refused):
        return refuse(request, err.status, str(err))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, err: StarletteHTTPException):
        message = {404: "there is nothing at this address", 405: "this address does not take that kind of request"}.get(
            err.status_code, str(err.detail)
        )
        return refuse(request, err.status_code, message)

    @app.exception_handler(Exception)
    async def _crash(request: Request, err: Exception):
        log.exception("error while serving %s", redacted(request.url.path))
        return refuse(
            request, 500, "something went wrong on our side; what you sent before is saved. Reload the page in a moment.", "Server error"
        )

    # ---- helpers ---------------------------------------------------------------------------------
    def participant(request: Request, token: str) -> Participant:
        p = store.find(token)
        # Valid links are limited per token, guesses per client address (so made-up tokens cannot grow the table).
        key = p.id if p is not None else "guess:" + (request.client.host if request.client else "?")
        if not per_token.allow(key):
            raise Refused("too many requests from this link; wait a minute and try again", status=429)
        if p is None:
            raise Refused("this link is not valid; check that you copied the whole link you were given", status=404)
        if p.withdrawn:
            raise Refused("you withdrew from this study and your data was deleted; this link cannot be used again", status=410)
        return p

    async def body(request: Request) -> dict:
        try:
            data = json.loads(await request.body() or b"{}")
        except (ValueError, RecursionError):  # (nested thousands deep: not a request this app takes)
            raise Refused("the request body is not JSON", status=400) from None
        if not isinstance(data, dict):
            raise Refused("the request body must be a JSON object", status=400)
        return data

    def text_field(data: dict, key: str) -> str:
        """A text the participant sent: a JSON string (anything else is refused), code points UTF-8
        cannot store (a lone surrogate) replaced, as rollouts clean every text where it enters."""
        value = data.get(key, "")
        if not isinstance(value, str):
            raise Refused(f"'{key}' must be text", status=400)
        return clean_text(value)[0].strip()

    def state(p: Participant) -> dict:
        history = store.messages(p.id) if p.started else []
        turns = sum(m.role == PARTICIPANT for m in history)
        out = {
            "stage": p.stage,
            "title": config.title,
            "consent": config.consent,
            "messages": [{"index": m.idx, "role": m.role, "content": m.content} for m in history],
            "waiting": p.stage == "chat" and (not history or history[-1].role == PARTICIPANT),
            "turns_left": max(0, limits.max_turns - turns),
            "seconds_left": max(0.0, limits.max_minutes * 60 - (time.time() - p.started)) if p.started else limits.max_minutes * 60,
            "max_message_chars": limits.max_message_chars,
            "payment": PAYMENT,
            "survey": [q.model_dump() for q in config.survey],
        }
        if p.task_id is not None:
            out["card"] = conditions.card(p.task_id)
        if p.stage in ("donation", "survey", "done"):
            out["donation"] = {"text": p.donation_text, "amount": p.donation, "confirmed": p.confirmed is not None}
        if p.stage == "done":
            out["code"] = p.code
            if config.redirect_url:
                sep = "&" if "?" in config.redirect_url else "?"
                out["redirect"] = f"{config.redirect_url}{sep}code={quote(p.code or '')}"
        reply = worker.reply(p.id)
        if out["waiting"] and reply is not None and reply.error:
            out["error"] = reply.error
        return out

    # ---- participant pages -----------------------------------------------------------------------
    @app.get("/", response_class=HTMLResponse)
    def home():
        return pages.refusal(config.title, "This is a research study server. Open the personal link you were given.")

    @app.get("/static/{name}")
    def static_file(name: str):
        if name not in static or name == "chat.html":
            raise StarletteHTTPException(404)
        kind = {"js": "text/javascript", "css": "text/css"}[name.rsplit(".", 1)[1]]
        return Response(static[name], media_type=kind, headers={"Cache-Control": "no-cache"})

    @app.get("/s/{token}", response_class=HTMLResponse)
    def chat_page(request: Request, token: str):
        participant(request, token)
        return HTMLResponse(
            static["chat.html"], headers={"Referrer-Policy": "no-referrer", "Cache-Control": "no-store", "Content-Security-Policy": CSP}
        )

    @app.get("/api/{token}/state")
    def get_state(request: Request, token: str):
        return state(participant(request, token))

    @app.post("/api/{token}/consent")
    def consent(request: Request, token: str):
        p = participant(request, token)
        store.consent(p.id, conditions.names, sorted(conditions.tasks), config.seed)
        return state(store.get(p.id))

    @app.post("/api/{token}/start")
    def start(request: Request, token: str):
        p = participant(request, token)
        if not worker.has_room():
            raise Refused("many people are chatting right now; please wait a few seconds and press start again", status=503)
        store.start(p.id)
        worker.submit(p.id)  # the agent speaks first
        return state(store.get(p.id))

    @app.post("/api/{token}/messages")
    async def send_message(request: Request, token: str):
        p = participant(request, token)
        text = text_field(await body(request), "text")
        if not text:
            raise Refused("your message is empty; write something before sending", status=400)
        if len(text) > limits.max_message_chars:
            raise Refused(
                f"your message is too long ({len(text):,} characters; at most {limits.max_message_chars:,}); nothing was stored", status=413
            )
        if not worker.has_room():
            raise Refused("many people are chatting right now; please wait a few seconds and send again (your text is kept)", status=503)
        index = await asyncio.to_thread(store.add_participant_message, p.id, text, limits.max_turns, limits.max_minutes * 60)
        worker.submit(p.id)
        return {"index": index, "stored": True}

    @app.post("/api/{token}/retry")
    def retry(request: Request, token: str):
        p = participant(request, token)
        if not state(p)["waiting"]:
            raise Refused("there is no reply to retry", status=409)
        worker.submit(p.id)
        return {"queued": True}

    @app.get("/api/{token}/events")
    async def events(request: Request, token: str):
        p = participant(request, token)

        async def stream():
            seen = -1
            while True:
                reply = worker.reply(p.id)
                if reply is None:
                    yield {"event": "idle", "data": "{}"}
                    return
                if reply.version != seen:
                    seen = reply.version
                    if reply.done:
                        kind = "error" if reply.error else "reply"
                        yield {"event": kind, "data": json.dumps({"text": reply.text, "index": reply.index, "error": reply.error})}
                        return
                    if reply.text:
                        yield {"event": "partial", "data": json.dumps({"text": reply.text})}
                if await request.is_disconnected():
                    return
                await asyncio.sleep(0.05)

        return EventSourceResponse(stream(), ping=15)

    @app.post("/api/{token}/end")
    def end(request: Request, token: str):
        p = participant(request, token)
        store.end(p.id)
        worker.forget(p.id)
        return state(store.get(p.id))

    @app.post("/api/{token}/donation")
    async def donation(request: Request, token: str):
        p = participant(request, token)
        text = text_field(await body(request), "text")
        if not text or len(text) > DONATION_CHARS:
            raise Refused(f"write how much you give, in at most {DONATION_CHARS} characters (for example: I give $0.50)", status=400)
        amount = await donations.parse(text)  # CPU work: in its own process, never on the loop that serves everyone
        if amount is not None:
            amount = min(max(amount, 0.0), PAYMENT)
        store.state_donation(p.id, text, amount)
        return state(store.get(p.id))

    @app.post("/api/{token}/donation/confirm")
    async def confirm(request: Request, token: str):
        p = participant(request, token)
        raw = (await body(request)).get("amount")
        try:
            amount = float(raw)
        except (TypeError, ValueError):
            raise Refused(f"the amount must be a number of dollars between 0 and {PAYMENT:.2f}", status=400) from None
        if not 0.0 <= amount <= PAYMENT:
            raise Refused(f"the amount must be between $0 and ${PAYMENT:.2f} (your payment)", status=400)
        store.confirm_donation(p.id, round(amount, 2))
        return state(store.get(p.id))

    @app.post("/api/{token}/survey")
    async def survey(request: Request, token: str):
        p = participant(request, token)
        given = (await body(request)).get("answers", {})
        if not isinstance(given, dict):
            raise Refused("answers must be an object of question id to answer", status=400)
        unknown = sorted(set(given) - {q.id for q in config.survey})
        if unknown:
            raise Refused(f"unknown question(s) {unknown}", status=400)
        answers = {}
        for q in config.survey:
            value = given.get(q.id)
            if value in (None, ""):
                if q.required:
                    raise Refused(f"please answer: {q.text}", status=400)
                continue
            if q.kind == "likert":
                rating = whole_number(value)
                if rating is None or not 1 <= rating <= q.scale:
                    raise Refused(f"the answer to '{q.text}' must be a whole number from 1 to {q.scale}", status=400)
                value = str(rating)
            else:
                value = text_field(given, q.id)
                if len(value) > limits.max_message_chars:
                    raise Refused(f"the answer to '{q.text}' is too long (at most {limits.max_message_chars:,} characters)", status=400)
            answers[q.id] = value
        store.complete(p.id, answers)
        return state(store.get(p.id))

    @app.post("/api/{token}/withdraw")
    def withdraw(request: Request, token: str):
        p = participant(request, token)
        worker.forget(p.id)
        store.withdraw(p.id)
        return {"stage": "withdrawn"}

    # ---- admin -------------------------------------------------------------------------------------
    def is_admin(request: Request) -> bool:
        return sessions.valid(request.cookies.get(ADMIN_COOKIE, ""))

    @app.get("/admin", response_class=HTMLResponse)
    def admin(request: Request):
        if not is_admin(request):
            return HTMLResponse(pages.admin_login(), status_code=401)
        return pages.admin_dashboard(
            config.title, store.progress(conditions.names), config.target_per_condition, worker.queued, worker.batch_sizes
        )

    @app.post("/admin/login")
    async def admin_login(request: Request):
        if not admin_attempts.allow(request.client.host if request.client else "?"):
            return HTMLResponse(pages.admin_login("too many attempts; wait a minute"), status_code=429)
        key = parse_qs((await request.body()).decode("utf-8", "replace")).get("key", [""])[0]
        if not same_secret(key, admin_key):
            return HTMLResponse(pages.admin_login("wrong admin key"), status_code=403)
        response = RedirectResponse("/admin", status_code=303)
        # Secure when the request came over HTTPS (directly, or through a proxy uvicorn trusts for X-Forwarded-Proto).
        response.set_cookie(
            ADMIN_COOKIE, sessions.start(), max_age=int(sessions.seconds), httponly=True, samesite="strict",
            secure=request.url.scheme == "https", path="/admin",
        )  # fmt: skip
        return response

    @app.post("/admin/logout")
    def admin_logout(request: Request):
        sessions.end(request.cookies.get(ADMIN_COOKIE, ""))
        response = RedirectResponse("/admin", status_code=303)
        response.delete_cookie(ADMIN_COOKIE, path="/admin")
        return response

    @app.post("/admin/invite", response_class=HTMLResponse)
    async def admin_invite(request: Request):
        if not is_admin(request):
            return HTMLResponse(pages.admin_login(), status_code=401)
        raw = parse_qs((await request.body()).decode("utf-8", "replace")).get("n", ["0"])[0]
        n = whole_number(raw) or 0
        if not 1 <= n <= 1000:
            return HTMLResponse(pages.refusal("Invitations", "ask for 1 to 1000 invitations"), status_code=400)
        base = str(request.base_url).rstrip("/")
        return pages.admin_links([f"{base}/s/{t}" for t in store.invite(n)])

    @app.get("/admin/export.{kind}")
    def admin_export(request: Request, kind: str):
        if not is_admin(request):
            return HTMLResponse(pages.admin_login(), status_code=401)
        records = store.records()
        if kind == "jsonl":
            return PlainTextResponse("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), media_type="application/x-ndjson")
        if kind == "csv":
            return PlainTextResponse(csv_text(records, [q.id for q in config.survey]), media_type="text/csv")
        raise StarletteHTTPException(404)

    app.add_middleware(BodyLimit, max_bytes=limits.max_request_bytes)
    app.add_middleware(SecurityHeaders)
    return app
