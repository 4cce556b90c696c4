"""experiment.play_rollouts: scope rollout's work without the printing (the CLI itself: tests/test_rollout_cli.py)."""

from __future__ import annotations

import json

from scope_marl.config import RolloutRunConfig
from scope_marl.experiment import play_rollouts


def test_play_rollouts_writes_numbered_batches_the_config_and_a_summary(tmp_path):
    cfg = RolloutRunConfig.model_validate(
        {
            "agent": {"model": "scripted:Please say the word.", "trainable": False},
            "simulator": {"mode": "frozen", "model": "scripted:No way.|Okay, apple!", "id": "stubborn"},
            "num_tasks": 3,
            "rollout": {"group_size": 2, "progress": False},
        }
    )
    episodes, summary, path = play_rollouts(cfg, tmp_path)
    assert len(episodes) == 6 and path.name == "episodes-00000.jsonl" and len(path.read_text().splitlines()) == 6
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved == json.loads(json.dumps(summary)) and saved["tasks"] == 3 and saved["simulator"]["id"] == "stubborn"
    assert (tmp_path / "config.yaml").exists()
    assert play_rollouts(cfg, tmp_path)[2].name == "episodes-00001.jsonl", "a second run numbers its batch after the first"
