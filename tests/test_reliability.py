"""Reliability through the `scope` CLI on real files and processes: bad bytes, empty replies, the run
lock, SIGKILL and a torn metrics line, a damaged checkpoint, and refusals without a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from scope_marl.cli import app
from scope_marl.config import ConfigError
from scope_marl.rollout.engine import EMPTY_REPLY

runner = CliRunner()
CLI = [sys.executable, "-m", "scope_marl.cli"]
ENV = {**os.environ, "PYTHONHASHSEED": "0", "COLUMNS": "400"}  # wide: messages that name long paths stay on one line

SCRIPTED_AGENT = {"model": "scripted:Please say the word.", "trainable": False}


def scope(*args, timeout: float = 180) -> subprocess.CompletedProcess:
    """`scope ARGS...` in a fresh process; stdout and stderr together in .stdout."""
    return subprocess.run([*CLI, *map(str, args)], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def rollout_config(simulator: dict, **overrides) -> dict:
    base = {
        "env": {"name": "say_the_word", "num_tasks": 3, "max_exchanges": 2},
        "agent": SCRIPTED_AGENT,
        "simulator": simulator,
        "rollout": {"group_size": 2, "max_concurrent": 4, "progress": False},
    }
    base.update(overrides)
    return base


def train_config(model_dir, **overrides) -> dict:
    """A short run on the tiny model (a scripted simulator keeps each step well under a second)."""
    base = {
        "model": f"hf:{model_dir}",
        "env": {"name": "say_the_word", "num_tasks": 8, "max_exchanges": 2},
        "agent_sampling": {"temperature": 1.0, "max_new_tokens": 6},
        "simulator": {"mode": "frozen", "model": "scripted:No way.|Okay, apple!"},
        "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "learner": {"lr": 0.01, "kl_coef": 0.01},
        "rollout": {"group_size": 2, "max_concurrent": 16, "on_turn_limit": "continue", "progress": False},
        "tasks_per_step": 2,
        "steps": 6,
        "checkpoint_every": 1,
        "keep_last": 3,
        "seed": 0,
        "threads": 1,
        "deterministic": True,
    }
    base.update(overrides)
    return base


def metric_steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def episode_ids(run: Path) -> list[str]:
    return [
        json.loads(line)["episode_id"] for batch in sorted((run / "rollouts").glob("*.jsonl")) for line in batch.read_text().splitlines()
    ]


def wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert proc.poll() is None, f"the run exited ({proc.returncode}) before {what}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# ---- bad bytes and empty replies -------------------------------------------------------------


@pytest.fixture
def surrogate_server() -> Iterator[str]:
    """A chat-completions server on 127.0.0.1 whose every reply holds a lone surrogate (JSON escape \\ud800)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            payload = {
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "Okay LONE apple!"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
            data = json.dumps(payload).replace("LONE", "\\ud800").encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


@pytest.mark.integration
def test_a_lone_surrogate_from_a_server_is_replaced_and_the_whole_batch_is_written(surrogate_server, tmp_path):
    simulator = {"mode": "frozen", "model": f"openai:m@{surrogate_server}"}
    cfg = write_yaml(tmp_path / "cfg.yaml", rollout_config(simulator))
    out = tmp_path / "run"
    result = scope("rollout", cfg, "--out", out)
    assert result.returncode == 0, result.stdout

    raw = (out / "episodes-00000.jsonl").read_bytes()
    episodes = [json.loads(line) for line in raw.decode("utf-8").splitlines()]  # strict UTF-8: no surrogate reached the file
    assert len(episodes) == 3 * 2, "every episode of the batch: tasks x group_size"
    for episode in episodes:
        replies = [m["content"] for m in episode["messages"] if m["role"] == "user"]
        assert replies and all(r == "Okay \ufffd apple!" for r in replies)
        assert episode["metadata"]["invalid_code_points"] == len(replies) >= 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 6 and summary["status"]["FAILED"] == 0


def test_an_empty_simulator_reply_fails_the_episode_unless_kept(tmp_path):
    whitespace = {"mode": "frozen", "model": "scripted:   "}
    failed = tmp_path / "failed"
    result = runner.invoke(app, ["rollout", str(write_yaml(tmp_path / "fail.yaml", rollout_config(whitespace))), "--out", str(failed)])
    assert result.exit_code == 0, result.output
    episodes = [json.loads(line) for line in (failed / "episodes-00000.jsonl").read_text().splitlines()]
    assert len(episodes) == 6 and {(e["status"], e["error"]) for e in episodes} == {("FAILED", EMPTY_REPLY)}
    summary = json.loads((failed / "summary.json").read_text())
    assert summary["status"]["FAILED"] == 6 and summary["failure_reasons"] == {EMPTY_REPLY: 6}

    kept_cfg = rollout_config(whitespace, rollout={"group_size": 2, "max_concurrent": 4, "progress": False, "on_empty_reply": "keep"})
    kept = tmp_path / "kept"
    result = runner.invoke(app, ["rollout", str(write_yaml(tmp_path / "keep.yaml", kept_cfg)), "--out", str(kept)])
    assert result.exit_code == 0, result.output
    episodes = [json.loads(line) for line in (kept / "episodes-00000.jsonl").read_text().splitlines()]
    assert len(episodes) == 6 and {e["status"] for e in episodes} == {"COMPLETED"}
    assert all(m["content"] == "   " for e in episodes for m in e["messages"] if m["role"] == "user")
    summary = json.loads((kept / "summary.json").read_text())
    assert summary["status"]["COMPLETED"] == 6 and summary["failure_reasons"] == {}


# ---- one process per run, kills and damaged files ------------------------------------------------


@pytest.mark.integration
def test_a_second_process_on_a_live_run_is_refused_naming_the_holder(tiny_model_dir, tmp_path):
    cfg = write_yaml(tmp_path / "train.yaml", train_config(tiny_model_dir))
    run = tmp_path / "run"
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen([*CLI, "train", str(cfg), "--out", str(run)], env=ENV, stdout=log, stderr=subprocess.STDOUT)

    def holds_lock() -> bool:
        try:
            return json.loads((run / ".lock").read_text())["pid"] == first.pid and (run / "config.yaml").exists()
        except (OSError, ValueError, KeyError):
            return False

    try:
        wait_for(holds_lock, first, "the run to take its lock")
        first.send_signal(signal.SIGSTOP)  # it keeps the lock while stopped, so the refusals cannot race its end
        try:
            others = [
                subprocess.Popen([*CLI, *args], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for args in (["train", "--resume", str(run)], ["train", str(cfg), "--out", str(run)])
            ]
            outputs = [p.communicate(timeout=120)[0] for p in others]
        finally:
            first.send_signal(signal.SIGCONT)
        for p, output in zip(others, outputs):
            assert p.returncode == 2, output
            assert "in use by another process" in output and f"pid {first.pid} on " in output and "Traceback" not in output
        assert first.wait(timeout=180) == 0, (tmp_path / "first.log").read_text()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert metric_steps(run) == [1, 2, 3, 4, 5, 6]


@pytest.mark.integration
def test_resume_after_sigkill_drops_a_torn_metrics_line_and_plays_each_step_once(tiny_model_dir, tmp_path):
    cfg = write_yaml(tmp_path / "train.yaml", train_config(tiny_model_dir))
    run = tmp_path / "run"
    killed = subprocess.Popen([*CLI, "train", str(cfg), "--out", str(run)], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: len(list(run.glob("checkpoints/step-*/state.json"))) >= 2, killed, "two checkpoints")
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
    assert not (run / "checkpoints" / "step-000006").exists(), "killed mid-run, not after the last step"
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 9, "rew')  # a crash mid-append

    result = scope("train", "--resume", run)
    assert result.returncode == 0, result.stdout
    assert "warning: dropped the torn last line" in result.stdout and str(run / "metrics.jsonl") in result.stdout
    assert metric_steps(run) == [1, 2, 3, 4, 5, 6]
    assert len(list((run / "rollouts").glob("episodes-*.jsonl"))) == 6
    ids = episode_ids(run)
    assert len(ids) == 6 * 2 * 2 and len(set(ids)) == len(ids), "every episode id once across all batches"


@pytest.mark.integration
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_previous_one_used(tiny_model_dir, tmp_path):
    cfg = write_yaml(tmp_path / "train.yaml", train_config(tiny_model_dir, steps=3))
    run = tmp_path / "run"
    first = scope("train", cfg, "--out", run)
    assert first.returncode == 0, first.stdout
    newest = run / "checkpoints" / "step-000003"
    optimizers = newest / "optimizers.pt"
    os.truncate(optimizers, optimizers.stat().st_size // 2)  # a disk that lost the end of a file
    saved = yaml.safe_load((run / "config.yaml").read_text())
    write_yaml(run / "config.yaml", {**saved, "steps": 4})

    result = scope("train", "--resume", run)
    assert result.returncode == 0, result.stdout
    warning = next(line for line in result.stdout.splitlines() if line.startswith("warning: checkpoint"))
    assert "step-000003" in warning and "optimizers.pt" in warning and "damaged-step-000003" in warning
    assert (run / "checkpoints" / "damaged-step-000003" / "optimizers.pt").exists()
    assert metric_steps(run) == [1, 2, 3, 4]
    assert sorted(p.name for p in (run / "rollouts").glob("episodes-*.jsonl")) == [f"episodes-{k:05d}.jsonl" for k in range(4)]
    ids = episode_ids(run)
    assert len(ids) == 4 * 2 * 2 and len(set(ids)) == len(ids)


# ---- refusals: `error: ...`, exit code 2, no traceback ---------------------------------------------


def refused(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and "Traceback" not in result.output and len(result.output.splitlines()) <= 5
    for needle in needles:
        assert needle in result.output, result.output


def test_empty_and_binary_configs_are_refused(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n  \n")
    refused(runner.invoke(app, ["rollout", str(empty), "--out", str(tmp_path / "o")]), str(empty), "is empty")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x00garbage")
    refused(runner.invoke(app, ["rollout", str(binary), "--out", str(tmp_path / "o")]), str(binary), "not a UTF-8 text file")
    assert not (tmp_path / "o").exists(), "nothing written for a refused config"


def test_a_p4g_corpus_folder_that_does_not_hold_the_corpus_is_refused(tmp_path, monkeypatch):
    missing = tmp_path / "does" / "not" / "exist"
    scripted = {"mode": "frozen", "model": "scripted:No."}
    cfg = write_yaml(tmp_path / "cfg.yaml", rollout_config(scripted, env={"name": "p4g", "data_dir": str(missing)}))
    result = runner.invoke(app, ["rollout", str(cfg), "--out", str(tmp_path / "o")])
    refused(result, "env.data_dir", str(missing), "does not hold the Persuasion for Good corpus")

    empty = tmp_path / "empty-corpus"
    empty.mkdir()
    cfg = write_yaml(tmp_path / "corpus.yaml", rollout_config(scripted, env={"name": "p4g", "source": "corpus", "data_dir": str(empty)}))
    refused(
        runner.invoke(app, ["rollout", str(cfg), "--out", str(tmp_path / "o")]), str(empty), "does not hold the Persuasion for Good corpus"
    )

    monkeypatch.setenv("SCOPE_P4G_DIR", str(missing))
    cfg = write_yaml(tmp_path / "env.yaml", rollout_config(scripted, env={"name": "p4g"}))
    result = runner.invoke(app, ["rollout", str(cfg), "--out", str(tmp_path / "o")])
    refused(result, "$SCOPE_P4G_DIR", str(missing), "does not hold the Persuasion for Good corpus")


def test_an_output_that_is_a_file_and_an_empty_rotation_are_refused(tiny_model_dir, tmp_path):
    cfg = write_yaml(tmp_path / "cfg.yaml", rollout_config({"mode": "frozen", "model": "scripted:No."}))
    file = tmp_path / "taken.txt"
    file.write_text("not a folder\n")
    refused(runner.invoke(app, ["rollout", str(cfg), "--out", str(file)]), str(file), "is a file")
    train = write_yaml(tmp_path / "train.yaml", train_config(tiny_model_dir))
    refused(runner.invoke(app, ["train", str(train), "--out", str(file)]), str(file), "is a file")
    assert file.read_text() == "not a folder\n"
    result = runner.invoke(app, ["rollout", str(cfg), "--out", str(tmp_path / "o"), "--simulator", "rotation:"])
    refused(result, "'rotation:'", "names no members")


@pytest.mark.integration
def test_debug_shows_the_traceback(tmp_path, monkeypatch):
    from scope_marl import cli

    monkeypatch.setitem(cli.DEBUG, "on", False)  # --debug sets a module-level flag: put it back afterwards
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    result = runner.invoke(app, ["--debug", "rollout", str(empty), "--out", str(tmp_path / "o")])
    assert isinstance(result.exception, ConfigError) and "is empty" in str(result.exception)
    shown = scope("--debug", "rollout", empty, "--out", tmp_path / "o")
    assert shown.returncode != 0 and "Traceback" in shown.stdout and "ConfigError" in shown.stdout
