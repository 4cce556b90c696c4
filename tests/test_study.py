"""The human-study server in process (FastAPI's TestClient on a real SQLite file).

The agent is a scripted model here (a real model's streaming is checked on the tiny transformers
model); the server, its storage and every limit are the real ones. The real-process tests (SIGKILL,
the browser) are in test_study_process.py.
"""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="the study extra is not installed: pip install -e '.[study]'")

from fastapi.testclient import TestClient

from scope_marl.assembly import ModelCache
from scope_marl.backends.scripted import ScriptedChatModel
from scope_marl.config import ConfigError
from scope_marl.config.study import StudyConfig, load_study
from scope_marl.study.server import build_server
from scope_marl.study.store import Store, choose

SYNTHETIC = {"name": "p4g", "source": "synthetic", "synthetic_tasks": 40}


def study(**overrides) -> StudyConfig:
    data = {
        "title": "Test study",
        "conditions": [
            {"name": "alpha", "model": "scripted:Hello, would you give $1 to Save the Children?|Thank you, every bit helps."},
            {"name": "beta", "model": "scripted:Hi! Children need help.|That is kind of you."},
        ],
        "env": SYNTHETIC,
    }
    data.update(overrides)
    return StudyConfig.model_validate(data)


@pytest.fixture
def server(tmp_path):
    made = []

    def make(config: StudyConfig | None = None, models: ModelCache | None = None, db=None):
        s = build_server(config or study(), db or tmp_path / "study.sqlite", models)
        made.append(s)
        return s, TestClient(s.app, raise_server_exceptions=False)

    yield make
    for s in made:
        s.close()


def wait_for_reply(client, token, timeout=10.0) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        state = client.get(f"/api/{token}/state").json()
        if not state["waiting"] or state.get("error"):
            return state
        time.sleep(0.02)
    raise AssertionError("no reply in time")


def to_chat(client, token) -> dict:
    assert client.post(f"/api/{token}/consent", json={}).json()["stage"] == "card"
    assert client.post(f"/api/{token}/start", json={}).json()["stage"] == "chat"
    return wait_for_reply(client, token)


def test_a_participant_goes_from_consent_to_completion_code_and_everything_is_stored(server, tmp_path):
    s, client = server(study(redirect_url="https://platform.example/done"))
    token = s.store.invite(1)[0]
    page = client.get(f"/s/{token}")
    assert page.status_code == 200 and "chat.js" in page.text
    state = client.get(f"/api/{token}/state").json()
    assert state["stage"] == "consent" and "withdraw" in state["consent"]
    state = to_chat(client, token)
    assert "Save the Children" in state["card"]
    assert [m["role"] for m in state["messages"]] == ["agent"]  # the agent opens, as in P4G
    ack = client.post(f"/api/{token}/messages", json={"text": "Why should I give?"})
    assert ack.json() == {"index": 1, "stored": True}
    with client.stream("GET", f"/api/{token}/events") as events:
        body = events.read().decode()
    assert "event: reply" in body
    state = wait_for_reply(client, token)
    assert [m["role"] for m in state["messages"]] == ["agent", "participant", "agent"]
    assert state["messages"][1]["content"] == "Why should I give?"
    assert client.post(f"/api/{token}/end", json={}).json()["stage"] == "donation"
    read = client.post(f"/api/{token}/donation", json={"text": "Okay, I'll give fifty cents."}).json()
    assert read["donation"] == {"text": "Okay, I'll give fifty cents.", "amount": 0.5, "confirmed": False}  # parse_donation
    assert client.post(f"/api/{token}/donation/confirm", json={"amount": 0.5}).json()["stage"] == "survey"
    refused = client.post(f"/api/{token}/survey", json={"answers": {"persuasive": 9, "natural": 4, "respectful": 7}})
    assert refused.status_code == 400 and "from 1 to 7" in refused.json()["error"]
    done = client.post(f"/api/{token}/survey", json={"answers": {"persuasive": 5, "natural": 4, "respectful": 7}}).json()
    assert done["stage"] == "done" and len(done["code"]) == 8
    assert done["redirect"] == f"https://platform.example/done?code={done['code']}"
    # Blind: nothing the participant's page receives names the condition.
    for name in ("alpha", "beta"):
        assert name not in str(done) and name not in page.text
    record = s.store.records()[0]
    assert record["condition"] in ("alpha", "beta") and record["donation"] == 0.5
    assert record["answers"] == {"persuasive": "5", "natural": "4", "respectful": "7"}
    jsonl, table = s.store.export(tmp_path / "export")
    assert "Why should I give?" in jsonl.read_text() and "q_persuasive" in table.read_text().splitlines()[0]


def test_conditions_are_assigned_balanced_and_withdrawn_participants_free_their_place(server):
    s, client = server()
    tokens = s.store.invite(7)
    for t in tokens[:6]:
        client.post(f"/api/{t}/consent", json={})
    assert {c: v["assigned"] for c, v in s.store.progress(["alpha", "beta"]).items() if c != "_all"} == {"alpha": 3, "beta": 3}
    alpha = next(p for p in s.store.participants() if p.condition == "alpha")
    s.store.withdraw(alpha.id)
    client.post(f"/api/{tokens[6]}/consent", json={})
    assert s.store.get(s.store.find(tokens[6]).id).condition == "alpha"
    assert choose({"a": 2, "b": 1, "c": 1}, __import__("random").Random(0)) in ("b", "c")


def test_withdrawing_deletes_the_participants_data_and_the_link_stops_working(server):
    s, client = server()
    token = s.store.invite(1)[0]
    to_chat(client, token)
    client.post(f"/api/{token}/messages", json={"text": "my private words"})
    wait_for_reply(client, token)
    pid = s.store.find(token).id
    assert client.post(f"/api/{token}/withdraw", json={}).json() == {"stage": "withdrawn"}
    with sqlite3.connect(s.store.path) as db:
        assert db.execute("SELECT COUNT(*) FROM messages WHERE participant = ?", (pid,)).fetchone()[0] == 0
        assert db.execute("SELECT condition, task_id FROM participants WHERE id = ?", (pid,)).fetchone() == (None, None)
        assert "my private words" not in "".join(r[0] for r in db.execute("SELECT content FROM messages"))
    gone = client.get(f"/api/{token}/state")
    assert gone.status_code == 410 and "withdrew" in gone.json()["error"]
    page = client.get(f"/s/{token}")
    assert page.status_code == 410 and "withdrew" in page.text and "<html" in page.text


def test_one_token_never_reaches_another_conversation(server):
    s, client = server()
    a, b = s.store.invite(2)
    to_chat(client, a)
    client.post(f"/api/{a}/messages", json={"text": "secret of A"})
    to_chat(client, b)
    assert "secret of A" not in str(client.get(f"/api/{b}/state").json())
    forged = a[:-4] + ("AAAA" if not a.endswith("AAAA") else "BBBB")
    for path in ("/state",):
        r = client.get(f"/api/{forged}{path}")
        assert r.status_code == 404 and "not valid" in r.json()["error"]
    r = client.post(f"/api/{forged}/messages", json={"text": "intruder"})
    assert r.status_code == 404
    with sqlite3.connect(s.store.path) as db:
        assert db.execute("SELECT COUNT(*) FROM messages WHERE content = 'intruder'").fetchone()[0] == 0
        stored = [r[0] for r in db.execute("SELECT token_hash FROM participants")]
    assert a not in stored and b not in stored  # only hashes: the database alone opens no link
    assert len(a) >= 32  # 24 random bytes, url-safe: 192 bits


def test_a_one_megabyte_message_is_refused_with_a_clear_error_and_nothing_is_stored(server):
    s, client = server()
    token = s.store.invite(1)[0]
    to_chat(client, token)
    before = len(s.store.messages(s.store.find(token).id))
    big = client.post(f"/api/{token}/messages", json={"text": "x" * 1_000_000})
    assert big.status_code == 413 and "too large" in big.json()["error"] and "nothing was stored" in big.json()["error"]
    long = client.post(f"/api/{token}/messages", json={"text": "y" * 1500})  # under the byte limit, over the characters
    assert long.status_code == 413 and "at most 1,000" in long.json()["error"]
    assert len(s.store.messages(s.store.find(token).id)) == before


def test_turn_and_rate_limits_refuse_with_a_clear_message(server):
    s, client = server(study(limits={"max_turns": 1, "requests_per_minute": 12}))
    token = s.store.invite(1)[0]
    to_chat(client, token)
    client.post(f"/api/{token}/messages", json={"text": "one"})
    wait_for_reply(client, token)
    second = client.post(f"/api/{token}/messages", json={"text": "two"})
    assert second.status_code == 409 and "end the conversation" in second.json()["error"]
    codes = [client.get(f"/api/{token}/state").status_code for _ in range(12)]
    assert 429 in codes
    limited = client.get(f"/api/{token}/state")
    assert limited.status_code == 429 and "wait a minute" in limited.json()["error"]


def test_a_full_queue_asks_participants_to_wait_and_stores_nothing(server):
    release = threading.Event()

    def held(prompt):
        release.wait(10)
        return "Held reply."

    models = ModelCache()
    models.register("held", ScriptedChatModel(held, name="held"))
    s, client = server(study(conditions=[{"name": "only", "model": "held"}], limits={"queue": 1}), models)
    t1, t2, t3 = s.store.invite(3)
    for t in (t1, t2, t3):
        client.post(f"/api/{t}/consent", json={})
    assert client.post(f"/api/{t1}/start", json={}).status_code == 200
    time.sleep(0.3)  # the worker takes t1 and blocks in generate: the queue is empty again
    assert client.post(f"/api/{t2}/start", json={}).status_code == 200  # queued (1 of 1)
    busy = client.post(f"/api/{t3}/start", json={})
    assert busy.status_code == 503 and "please wait" in busy.json()["error"]
    assert client.get(f"/api/{t3}/state").json()["stage"] == "card"  # nothing changed: start again later
    release.set()
    assert len(wait_for_reply(client, t1)["messages"]) == 1 and len(wait_for_reply(client, t2)["messages"]) == 1


def test_a_generation_error_is_reported_and_retry_regenerates(server):
    calls = {"n": 0}

    def flaky(prompt):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("backend down: internal detail")
        return "Back again."

    models = ModelCache()
    models.register("flaky", ScriptedChatModel(flaky, name="flaky"))
    s, client = server(study(conditions=[{"name": "only", "model": "flaky"}]), models)
    token = s.store.invite(1)[0]
    state = to_chat(client, token)
    assert state["waiting"] and "retry" in state["error"] and "internal detail" not in state["error"]
    assert client.post(f"/api/{token}/retry", json={}).json() == {"queued": True}
    assert wait_for_reply(client, token)["messages"][0]["content"] == "Back again."


def test_no_stack_trace_reaches_a_client(server, monkeypatch):
    s, client = server()
    token = s.store.invite(1)[0]

    def broken(token):
        raise RuntimeError("sqlite internals at /secret/path")

    monkeypatch.setattr(s.store, "find", broken)
    for r in (client.get(f"/api/{token}/state"), client.get(f"/s/{token}")):
        assert r.status_code == 500
        assert "Traceback" not in r.text and "/secret/path" not in r.text and "saved" in r.text


def test_admin_pages_need_the_admin_key_and_escape_what_they_show(server):
    s, client = server()
    assert client.get("/admin").status_code == 401
    assert client.get("/admin/export.jsonl").status_code == 401
    assert client.post("/admin/login", data={"key": "wrong"}).status_code == 403
    token = s.store.invite(1)[0]
    to_chat(client, token)
    client.post(f"/api/{token}/messages", json={"text": "<script>alert('x')</script>"})
    wait_for_reply(client, token)
    ok = client.post("/admin/login", data={"key": s.store.secret("admin_key")}, follow_redirects=True)
    assert ok.status_code == 200 and "alpha" in ok.text and "beta" in ok.text and "completed" in ok.text
    export = client.get("/admin/export.jsonl")
    assert export.headers["content-type"].startswith("application/x-ndjson") and "<script>alert('x')</script>" in export.text
    links = client.post("/admin/invite", data={"n": "2"})
    assert links.text.count("/s/") == 2
    page = client.get("/s/%3Cscript%3Ealert(1)%3C%2Fscript%3E")
    assert page.status_code == 404 and "<script>alert(1)" not in page.text


def test_the_agent_sees_the_persuader_prompt_and_the_conversation(server):
    seen = []

    def record(prompt):
        seen.append(prompt)
        return "Would you donate $1?"

    models = ModelCache()
    models.register("rec", ScriptedChatModel(record, name="rec"))
    s, client = server(study(conditions=[{"name": "only", "model": "rec"}]), models)
    token = s.store.invite(1)[0]
    to_chat(client, token)
    client.post(f"/api/{token}/messages", json={"text": "Tell me more."})
    wait_for_reply(client, token)
    last = seen[-1]
    assert last[0].role == "system" and "persuade them to donate" in last[0].content
    assert [(m.role, m.content) for m in last[1:]] == [("assistant", "Would you donate $1?"), ("user", "Tell me more.")]


def test_a_restarted_server_resumes_a_conversation_left_waiting(server, tmp_path):
    release = threading.Event()
    models = ModelCache()
    models.register("held", ScriptedChatModel(lambda p: (release.wait(5), "First reply.")[1], name="held"))
    config = study(conditions=[{"name": "only", "model": "held"}])
    s, client = server(config, models)
    token = s.store.invite(1)[0]
    client.post(f"/api/{token}/consent", json={})
    client.post(f"/api/{token}/start", json={})
    s.store.close()  # the "crash": the reply is never stored
    release.set()
    time.sleep(0.2)
    models2 = ModelCache()
    models2.register("held", ScriptedChatModel(["Resumed reply."], name="held"))
    s2, client2 = server(config, models2, db=s.store.path)
    assert s2.resumed == 1
    assert wait_for_reply(client2, token)["messages"][0]["content"] == "Resumed reply."


def test_streaming_tokens_match_the_generation(tiny_chat):
    from scope_marl.core.types import Message, SamplingParams

    seen: dict[int, list[int]] = {0: [], 1: []}
    prompts = [tiny_chat.encode_chat([Message(role="user", content=t)]) for t in ("Hello there", "Hi")]
    outs = tiny_chat.generate_ids(
        prompts, SamplingParams(temperature=1.0, max_new_tokens=12), seeds=[1, 2], on_token=lambda i, t: seen[i].append(t)
    )
    assert [seen[0], seen[1]] == [outs[0].token_ids, outs[1].token_ids] and seen[0]
    again = tiny_chat.generate_ids(prompts, SamplingParams(temperature=1.0, max_new_tokens=12), seeds=[1, 2])
    assert [o.token_ids for o in again] == [o.token_ids for o in outs]  # streaming changes nothing


def test_a_real_model_streams_its_reply_and_stores_it_whole(server, tiny_model_dir):
    s, client = server(
        study(conditions=[{"name": "tiny", "model": f"hf:{tiny_model_dir}"}], sampling={"temperature": 1.0, "max_new_tokens": 24})
    )
    token = s.store.invite(1)[0]
    state = to_chat(client, token)
    stored = state["messages"][0]["content"]
    reply = s.worker.reply(s.store.find(token).id)
    assert reply.done and reply.text == stored and reply.version >= 2  # updated token by token, then finished


def test_a_study_file_with_a_typo_is_a_clear_error(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text("conditions:\n  - name: base\n    agnet: base\n")
    with pytest.raises(ConfigError, match="agnet"):
        load_study(path)
    path.write_text("conditions:\n  - {name: a}\n  - {name: a}\n")
    with pytest.raises(ConfigError, match="distinct"):
        load_study(path)


def test_the_shipped_study_config_loads():
    config = load_study("configs/study_p4g.yaml")
    assert config.conditions[0].name == "base" and len(config.conditions) >= 3


def test_store_opens_in_wal_mode(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    try:
        assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        store.close()


def complete(client, token, donation: str, amount: float, score: int) -> None:
    to_chat(client, token)
    client.post(f"/api/{token}/messages", json={"text": "Tell me more."})
    wait_for_reply(client, token)
    client.post(f"/api/{token}/end", json={})
    client.post(f"/api/{token}/donation", json={"text": donation})
    client.post(f"/api/{token}/donation/confirm", json={"amount": amount})
    done = client.post(f"/api/{token}/survey", json={"answers": {"persuasive": score, "natural": score, "respectful": score}})
    assert done.json()["stage"] == "done"


def test_the_report_and_the_cli_read_what_participants_did(server, tmp_path):
    from typer.testing import CliRunner

    from scope_marl.cli import app
    from scope_marl.study.report import write_report

    config = study()
    s, client = server(config)
    tokens = s.store.invite(5)
    for i, t in enumerate(tokens[:4]):
        complete(client, t, "I'll give $1" if i % 2 else "No, nothing.", 1.0 if i % 2 else 0.0, 3 + i)
    client.post(f"/api/{tokens[4]}/consent", json={})  # started, not completed: not in the report
    by_condition = {}
    for r in s.store.records(include_incomplete=False):
        by_condition.setdefault(r["condition"], []).append(r)
    path = write_report(s.store.path, config, tmp_path / "report")
    text = path.read_text()
    summary = __import__("json").loads((tmp_path / "report" / "summary.json").read_text())
    for name, rows in by_condition.items():
        assert summary[name]["n"] == len(rows)
        assert summary[name]["donation"]["mean"] == pytest.approx(sum(r["donation"] for r in rows) / len(rows))
        assert f"| {name} | {len(rows)} |" in text
    assert (tmp_path / "report" / "study.png").stat().st_size > 1000 and (tmp_path / "report" / "report.html").exists()
    study_file = tmp_path / "study.yaml"
    study_file.write_text(__import__("yaml").safe_dump(config.model_dump(mode="json")))
    runner = CliRunner()
    out = runner.invoke(app, ["study", "export", "--db", str(s.store.path), "--out", str(tmp_path / "export")])
    assert out.exit_code == 0 and len((tmp_path / "export" / "participants.jsonl").read_text().splitlines()) == 5
    out = runner.invoke(app, ["study", "invite", "--db", str(s.store.path), "--n", "2", "--base-url", "https://x.org"])
    assert out.exit_code == 0 and out.output.count("https://x.org/s/") == 2
    out = runner.invoke(app, ["study", "report", str(study_file), "--db", str(tmp_path / "missing.sqlite"), "--out", str(tmp_path / "r2")])
    assert out.exit_code == 2 and "no study database" in out.output and "Traceback" not in out.output


def test_trained_checkpoints_share_one_loaded_base_model_with_an_adapter_each(server, tiny_model_dir, tmp_path):
    from scope_marl.config import TrainConfig
    from scope_marl.experiment import start

    run = tmp_path / "run"
    train = {
        "model": f"hf:{tiny_model_dir}",
        "env": {"name": "say_the_word", "num_tasks": 4, "max_exchanges": 1},
        "agent_sampling": {"temperature": 1.0, "max_new_tokens": 4},
        "simulator": {"mode": "frozen", "model": f"hf:{tiny_model_dir}", "sampling": {"temperature": 1.0, "max_new_tokens": 4}},
        "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "rollout": {"group_size": 2, "on_turn_limit": "continue", "progress": False},
        "tasks_per_step": 1,
        "steps": 1,
        "checkpoint_every": 1,
        "threads": 1,
    }
    start(TrainConfig.model_validate(train), run).run(progress=False)
    config = study(
        conditions=[{"name": "base", "agent": "base", "model": f"hf:{tiny_model_dir}"}, {"name": "trained", "agent": str(run)}],
        sampling={"temperature": 1.0, "max_new_tokens": 8},
    )
    s, client = server(config)
    agents = s.worker.conditions.agents
    assert agents["trained"].chat is agents["base"].chat  # one copy of the weights
    assert agents["base"].adapter is None and agents["trained"].adapter == "study-trained"
    tokens = s.store.invite(2)
    for t in tokens:
        client.post(f"/api/{t}/consent", json={})
    conditions = {s.store.find(t).id: s.store.find(t).condition for t in tokens}
    assert sorted(conditions.values()) == ["base", "trained"]
    for t in tokens:
        client.post(f"/api/{t}/start", json={})
    for t in tokens:
        assert len(wait_for_reply(client, t, timeout=60)["messages"]) == 1
