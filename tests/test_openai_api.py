"""OpenAIChatModel against a real HTTP server on 127.0.0.1 that plays a scripted chat-completions API."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from scope_marl.backends.base import BackendError, ChatModel, SamplingParams
from scope_marl.backends.openai_api import OpenAIChatModel
from scope_marl.core.types import Message

KEY_ENV = "SCOPE_TEST_OPENAI_KEY"  # never a real key variable, so the tests cannot pick one up

# respond(body, n) -> (status, payload, extra headers); n counts requests from 1.
Responder = Callable[[dict, int], tuple[int, dict, dict[str, str]]]


def completion(text: str, finish: str = "stop", logprobs: list[tuple[str, float]] | None = None) -> dict:
    choice: dict = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
    if logprobs is not None:
        choice["logprobs"] = {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []} for t, lp in logprobs]}
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": "test-model",
        "choices": [choice],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def ok(text: str, **kw) -> tuple[int, dict, dict[str, str]]:
    return 200, completion(text, **kw), {}


def error(status: int, headers: dict[str, str] | None = None) -> tuple[int, dict, dict[str, str]]:
    return status, {"error": {"message": f"scripted {status}", "type": "server_error", "code": None}}, headers or {}


class FakeServer:
    """Records every request (path, headers, JSON body) and tracks how many are in flight."""

    def __init__(self, respond: Responder) -> None:
        self.respond = respond
        self.requests: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real servers do

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake._lock:
                    fake.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
                    n = len(fake.requests)
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                try:
                    status, payload, headers = fake.respond(body, n)
                finally:
                    with fake._lock:
                        fake.in_flight -= 1
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Responder], FakeServer]]:
    monkeypatch.delenv(KEY_ENV, raising=False)
    servers: list[FakeServer] = []

    def start(respond: Responder) -> FakeServer:
        servers.append(FakeServer(respond))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


@pytest.fixture
def models() -> Iterator[Callable[..., OpenAIChatModel]]:
    made: list[OpenAIChatModel] = []

    def make(**kw) -> OpenAIChatModel:
        kw.setdefault("model", "test-model")
        kw.setdefault("api_key_env", KEY_ENV)
        made.append(OpenAIChatModel(**kw))
        return made[-1]

    yield make
    for m in made:
        m.close()


def prompt(text: str) -> list[Message]:
    return [Message(role="system", content="be brief"), Message(role="user", content=text)]


def test_batch_returns_texts_in_order_and_sends_sampling(serve, models) -> None:
    def respond(body: dict, n: int):
        i = int(body["messages"][-1]["content"][-1])
        time.sleep(0.05 * (3 - i))  # the first prompt finishes last: order must come from the batch
        return ok(f"reply {i}")

    server = serve(respond)
    model = models(base_url=server.base_url)
    assert isinstance(model, ChatModel) and model.name == "test-model"
    sampling = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=17, seed=5)
    gens = model.generate([prompt(f"q{i}") for i in range(3)], sampling)

    assert [g.text for g in gens] == ["reply 0", "reply 1", "reply 2"]
    assert all(g.finish_reason == "stop" and g.token_ids == [] and g.logprobs is None for g in gens)
    assert len(server.requests) == 3
    by_prompt = {r["body"]["messages"][-1]["content"]: r for r in server.requests}
    req = by_prompt["q1"]
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["authorization"] == "Bearer EMPTY"  # loopback server, no key set
    body = req["body"]
    assert body["model"] == "test-model"
    assert body["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q1"}]
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"]) == (0.7, 0.9, 17, 5)
    assert not {"stop", "logprobs", "response_format"} & body.keys()


def test_api_key_is_read_from_the_named_variable(serve, models, monkeypatch) -> None:
    server = serve(lambda body, n: ok("hi"))
    monkeypatch.setenv(KEY_ENV, "sk-test-123")
    models(base_url=server.base_url).generate([prompt("q")], SamplingParams())
    assert server.requests[0]["headers"]["authorization"] == "Bearer sk-test-123"


def test_one_503_is_retried(serve, models) -> None:
    server = serve(lambda body, n: error(503) if n == 1 else ok("recovered"))
    start = time.monotonic()
    gens = models(base_url=server.base_url, max_retries=3).generate([prompt("q")], SamplingParams())
    assert gens[0].text == "recovered"
    assert len(server.requests) == 2
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize(
    ("status", "headers"),
    [(503, {}), (429, {"retry-after-ms": "10"})],  # the second also shows a server-directed delay is honoured
)
def test_persistent_errors_raise_after_retries(serve, models, status, headers) -> None:
    server = serve(lambda body, n: error(status, headers))
    model = models(base_url=server.base_url, max_retries=2)
    with pytest.raises(BackendError) as info:
        model.generate([prompt("q")], SamplingParams())
    assert len(server.requests) == 3  # max_retries + 1
    msg = str(info.value)
    assert server.base_url in msg and "3 attempt" in msg and f"HTTP {status}" in msg and "test-model" in msg


def test_timeouts_are_retried_then_reported(serve, models) -> None:
    def slow(body: dict, n: int):
        time.sleep(1.0)
        return ok("too late")

    server = serve(slow)
    model = models(base_url=server.base_url, max_retries=1, timeout_s=0.2)
    with pytest.raises(BackendError, match=r"2 attempt.*timed out"):
        model.generate([prompt("q")], SamplingParams())
    assert len(server.requests) == 2


def test_unreachable_server_raises_backend_error(models) -> None:
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = models(base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)
    with pytest.raises(BackendError, match=rf"127\.0\.0\.1:{port}.*1 attempt.*reachable"):
        model.generate([prompt("q")], SamplingParams())


def test_response_format_is_passed_verbatim_and_can_be_overridden(serve, models) -> None:
    server = serve(lambda body, n: ok('{"answer": 1}'))
    schema = {
        "type": "json_schema",
        "json_schema": {
            "name": "verdict",
            "strict": True,
            "schema": {
                "type": "object",
                "properties": {"answer": {"type": "integer"}},
                "required": ["answer"],
                "additionalProperties": False,
            },
        },
    }
    model = models(base_url=server.base_url, response_format=schema)
    assert model.generate([prompt("q")], SamplingParams())[0].text == '{"answer": 1}'
    assert server.requests[0]["body"]["response_format"] == schema

    other = {"type": "json_object"}
    model.generate([prompt("q")], SamplingParams(), response_format=other)
    assert server.requests[1]["body"]["response_format"] == other


def test_logprobs_returned_when_requested(serve, models) -> None:
    server = serve(lambda body, n: ok("Hi there", logprobs=[("Hi", -0.5), (" there", -1.5)]))
    gen = models(base_url=server.base_url, request_logprobs=True).generate([prompt("q")], SamplingParams())[0]
    assert server.requests[0]["body"]["logprobs"] is True
    assert gen.logprobs == [-0.5, -1.5] and gen.mean_logprob == -1.0

    plain = models(base_url=server.base_url).generate([prompt("q")], SamplingParams())[0]
    assert plain.logprobs is None


def test_stop_strings_cut_text_and_logprobs(serve, models) -> None:
    # A server that ignores the 5th stop (only 4 are sent) and returns text past it.
    tokens = [("Hello", -0.1), (" E", -0.2), ("ND", -0.3), (" world", -0.4)]
    server = serve(lambda body, n: ok("Hello END world", logprobs=tokens))
    stops = ["A1", "B2", "C3", "D4", "END"]
    gen = models(base_url=server.base_url, request_logprobs=True).generate([prompt("q")], SamplingParams(stop=stops))[0]
    assert server.requests[0]["body"]["stop"] == stops[:4]
    assert gen.text == "Hello "
    assert gen.logprobs == [-0.1, -0.2, -0.3]  # through the stop string, not past it
    assert gen.finish_reason == "stop"


def test_length_finish_reason(serve, models) -> None:
    server = serve(lambda body, n: ok("cut off", finish="length"))
    gen = models(base_url=server.base_url).generate([prompt("q")], SamplingParams(max_new_tokens=2))[0]
    assert gen.finish_reason == "length"


def test_concurrency_is_bounded(serve, models) -> None:
    def slow(body: dict, n: int):
        time.sleep(0.1)
        return ok(body["messages"][-1]["content"])

    server = serve(slow)
    gens = models(base_url=server.base_url, max_concurrency=2).generate([prompt(f"q{i}") for i in range(6)], SamplingParams())
    assert [g.text for g in gens] == [f"q{i}" for i in range(6)]
    assert 1 < server.max_in_flight <= 2


def test_missing_key_for_remote_server_fails_without_network(models, monkeypatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the backend tried to open a connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    with pytest.raises(BackendError, match=KEY_ENV):
        models(base_url="https://api.example.invalid/v1")


def test_adapters_are_rejected(serve, models) -> None:
    server = serve(lambda body, n: ok("x"))
    model = models(base_url=server.base_url)
    with pytest.raises(BackendError, match="unknown LoRA adapter"):
        model.generate([prompt("q")], SamplingParams(), adapters=["lora-a"])
    assert model.generate([prompt("q")], SamplingParams(), adapters=[None])[0].text == "x"
    assert len(server.requests) == 1
