"""Trackers: Weights & Biases offline runs of scope train (read back from W&B's own files), a killed
run resumed into the same W&B run, and a failing tracker costing a warning, never a step."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from test_trainer import config, train_until_killed

from scope_marl.config import TrainConfig
from scope_marl.core import run_layout
from scope_marl.training.trackers import Trackers

needs_wandb = pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="the wandb extra is not installed")


def wandb_records(path: Path) -> list:
    """Every record of a ``.wandb`` file, decoded with W&B's own protobuf classes. The file is W&B's
    LevelDB-style log: a 7-byte header (":W&B", magic 0xBEE1, version), then 32 KiB blocks of chunks,
    each with a 7-byte header (CRC, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1
    records, pos, chunk = [], 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:
            pos += 32768 - pos % 32768  # a block's tail too short for a header is padding
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            break
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def offline_runs(run_dir: Path) -> list[tuple[str, list[dict], dict]]:
    """Per offline run folder (oldest first): its W&B run id, history rows ({key: value}) and config."""
    out = []
    for folder in sorted((run_dir / "wandb").glob("offline-run-*")):
        (log,) = folder.glob("run-*.wandb")
        rows, cfg, run_id = [], {}, None
        for r in wandb_records(log):
            kind = r.WhichOneof("record_type")
            if kind == "history":
                rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item})
            elif kind == "run":
                run_id = r.run.run_id
                cfg.update({i.key: json.loads(i.value_json) for i in r.run.config.update})
            elif kind == "config":
                cfg.update({i.key: json.loads(i.value_json) for i in r.config.update})
        out.append((run_id, rows, cfg))
    return out


@pytest.fixture
def no_wandb_key(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))


@needs_wandb
@pytest.mark.integration
def test_an_offline_wandb_run_holds_the_metrics_samples_config_and_figures(tiny_model_dir, tmp_path, no_wandb_key, capsys):
    from scope_marl.experiment import train

    cfg = TrainConfig.model_validate(
        config(tiny_model_dir, steps=2, checkpoint_every=1, logging={"trackers": ["wandb"], "wandb": {"project": "t", "tags": ["ci"]}})
    )
    run_dir = tmp_path / "run"
    train(cfg, run_dir, progress=False)
    err = capsys.readouterr().err
    assert "logging offline" in err and "stopped" not in err, err  # said at start
    state = json.loads((run_dir / run_layout.WANDB_RUN).read_text())
    ((run_id, rows, saved), *more) = offline_runs(run_dir)
    assert not more and run_id == state["id"] and state["durable_step"] == 2
    assert saved["steps"] == 2 and saved["learner"]["lr"] == 0.01  # the run's config
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    by_step = {}
    for row in rows:
        by_step.setdefault(row["_step"], {}).update(row)
    assert sorted(by_step) == [1, 2]
    for record in metrics:
        logged = by_step[record["step"]]
        assert logged["reward_agent/mean"] == pytest.approx(record["reward_agent"]["mean"])
        assert logged["train_agent/loss"] == pytest.approx(record["train_agent"]["loss"])
        assert logged["samples/_type"] == "table-file"
    assert by_step[2]["eval/reward_agent"] == pytest.approx(metrics[1]["eval"]["reward_agent"])
    assert by_step[2]["figures/collapse/_type"] == "image-file"  # the report's figures, once at the end
    tables = list((run_dir / "wandb").glob("offline-run-*/files/media/table/samples_*.table.json"))
    table = json.loads(tables[0].read_text())
    assert len(tables) == 2 and table["columns"][-1] == "dialogue" and len(table["data"]) == 3
    assert (run_dir / run_layout.REPORT / "collapse.png").is_file()


@needs_wandb
@pytest.mark.integration
def test_a_killed_run_resumes_into_the_same_wandb_run(tiny_model_dir, tmp_path):
    cfg_path = tmp_path / "train.yaml"
    cfg_path.write_text(yaml.safe_dump(config(tiny_model_dir, steps=4, checkpoint_every=2, logging={"trackers": ["wandb"]})))
    # No WANDB_* from this process: an earlier in-process run leaves WANDB_SERVICE naming its own W&B service.
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(PYTHONHASHSEED="0", NETRC=str(tmp_path / "no-netrc"), WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"))
    cli = [sys.executable, "-m", "scope_marl.cli", "train"]
    train_until_killed(cli, cfg_path, tmp_path / "run", env)
    first_id = json.loads((tmp_path / "run" / run_layout.WANDB_RUN).read_text())["id"]
    resumed = subprocess.run([*cli, "--resume", str(tmp_path / "run")], env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert f"continuing W&B run {first_id}" in resumed.stderr, resumed.stderr[:2000]
    runs = offline_runs(tmp_path / "run")
    assert len(runs) == 2 and {run_id for run_id, _, _ in runs} == {first_id}
    steps = [[row["_step"] for row in rows if "reward_agent/mean" in row] for _, rows, _ in runs]
    # Every step reached W&B; one logged in the killed run's last seconds may be there twice (never missing).
    assert set(steps[0] + steps[1]) == {1, 2, 3, 4} and steps[1] and len(steps[0] + steps[1]) <= 6


class Exploding:
    wants_figures = True

    def log_step(self, record):
        raise OSError(28, "No space left on device")

    def log_samples(self, step, episodes): ...

    def log_figures(self, step, figures): ...

    def close(self): ...


def test_a_failing_tracker_is_a_warning_and_the_others_go_on(tmp_path):
    said = []
    trackers = Trackers(TrainConfig(), tmp_path, say=said.append)
    seen = []

    class Quiet(Exploding):
        def log_step(self, record):
            seen.append(record["step"])

    trackers.live.update(wandb=Exploding(), tensorboard=Quiet())
    for step in (1, 2):
        trackers.log_step({"step": step, "reward": 0.5})
    assert seen == [1, 2] and list(trackers.live) == ["tensorboard"]
    assert len(said) == 1 and "wandb tracker stopped" in said[0] and "No space left" in said[0] and "metrics.jsonl" in said[0]

    def cannot_draw():
        raise RuntimeError("no display")

    trackers.live["wandb"] = Exploding()
    trackers.log_figures(2, cannot_draw)  # the run is done: a figure that cannot be drawn is a warning
    assert "could not be drawn" in said[-1] and "no display" in said[-1] and "wandb" in trackers.live


@needs_wandb
def test_a_tracker_that_cannot_start_is_a_warning_and_a_missing_package_an_error(tmp_path, monkeypatch, no_wandb_key):
    import wandb

    def refuse(**kwargs):
        raise wandb.errors.UsageError("api_key not configured (no-tty)")

    monkeypatch.setattr(wandb, "init", refuse)
    said = []
    cfg = TrainConfig(logging={"trackers": ["wandb"], "wandb": {"mode": "online"}})
    assert not Trackers(cfg, tmp_path, say=said.append)
    assert "wandb tracker stopped" in said[-1] and "api_key" in said[-1]
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if the extra were not installed
    with pytest.raises(ImportError, match=r"scope-marl\[wandb\]"):
        Trackers(cfg, tmp_path, say=said.append)


def test_every_tracker_a_config_can_name_is_registered():
    from typing import get_args

    from scope_marl.config.train import Tracker
    from scope_marl.training.trackers import TRACKERS

    assert TRACKERS.names() == sorted(get_args(Tracker))


@needs_wandb
@pytest.mark.integration
def test_a_step_counts_as_written_only_after_a_later_step_sent_its_row(tiny_model_dir, tmp_path, no_wandb_key, monkeypatch):
    """``run.log(..., step=N)`` only gathers step N's row; W&B sends it when a later step is logged. A
    step logged long ago whose row was sent a moment ago is not yet written (a kill then loses it)."""
    from scope_marl.training import wandb_tracker

    cfg = TrainConfig.model_validate(config(tiny_model_dir, steps=3, logging={"trackers": ["wandb"]}))
    clock = iter([0.0, 10.0, 20.0])
    monkeypatch.setattr(wandb_tracker, "time", SimpleNamespace(monotonic=lambda: next(clock)))  # the tracker's clock only
    tracker = wandb_tracker.WandbTracker(cfg, tmp_path, say=lambda _: None)
    try:
        tracker.log_step({"step": 1, "x": 1.0})
        tracker.log_step({"step": 2, "x": 2.0})  # 10 s after step 1, but step 1's row leaves only now
        assert json.loads((tmp_path / run_layout.WANDB_RUN).read_text())["durable_step"] == 0
        tracker.log_step({"step": 3, "x": 3.0})  # step 1's row left 10 s ago; step 2's leaves now
        assert json.loads((tmp_path / run_layout.WANDB_RUN).read_text())["durable_step"] == 1
        time.sleep(2 * wandb_tracker.FLUSH_S + 0.5)  # what counting it as written claims: it is in W&B's log now
        ((_, rows, _),) = offline_runs(tmp_path)
        assert [row["_step"] for row in rows if "x" in row] == [1, 2]
    finally:
        tracker.close()
    assert json.loads((tmp_path / run_layout.WANDB_RUN).read_text())["durable_step"] == 3
