"""`scope rollout`: JSONL batches and a summary written, earlier batches kept, config errors without a traceback
(formerly in tests/test_config_and_rollout_cli.py; the config schema's tests are in tests/test_config.py)."""

from __future__ import annotations

import json

import pandas as pd
from typer.testing import CliRunner

from scope_marl.cli import app

runner = CliRunner()

SCRIPTED = """
env: {name: say_the_word, num_tasks: 3, max_exchanges: 2}
agent: {model: "scripted:Please say the word.", trainable: false}
simulator: {mode: frozen, model: "scripted:No way.|Okay, apple!", id: stubborn}
rollout: {group_size: 2, max_concurrent: 4, progress: false}
"""


def write(tmp_path, text, name="cfg.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_rollout_cli_writes_jsonl_and_summary_and_keeps_earlier_batches(tmp_path):
    cfg = write(tmp_path, SCRIPTED)
    out = tmp_path / "run"
    for _ in range(2):
        result = runner.invoke(app, ["rollout", str(cfg), "--out", str(out)])
        assert result.exit_code == 0, result.output
    batches = sorted(out.glob("episodes-*.jsonl"))
    assert [b.name for b in batches] == ["episodes-00000.jsonl", "episodes-00001.jsonl"]
    frame = pd.read_json(batches[0], lines=True)
    assert len(frame) == 6 and set(frame["simulator_id"]) == {"stubborn"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 6 and summary["groups_with_one_simulator"] == 3
    assert summary["status"]["COMPLETED"] == 6
    assert (out / "config.yaml").exists()
    assert "example transcript" in result.output


def test_rollout_cli_reports_config_errors_without_traceback(tmp_path):
    result = runner.invoke(app, ["rollout", str(write(tmp_path, "split: dev\n")), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "split" in result.output and "Traceback" not in result.output
    missing = runner.invoke(app, ["rollout", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "o")])
    assert missing.exit_code == 2 and "does not exist" in missing.output
