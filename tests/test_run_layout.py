"""The run layout (core.run_layout): which checkpoint folders count, and which one a run directory resolves to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scope_marl.core import run_layout


def make_checkpoint(run_dir: Path, step: int, best: str | None = None) -> Path:
    path = run_layout.checkpoint_dir(run_dir, step)
    path.mkdir(parents=True)
    state = {"step": step, "cursor": 0, "best": [0.5, best] if best else None}
    (path / run_layout.STATE).write_text(json.dumps(state))
    return path


def test_list_checkpoints_skips_incomplete_and_temporary_folders(tmp_path):
    first = make_checkpoint(tmp_path, 1)
    third = make_checkpoint(tmp_path, 3)
    (tmp_path / "checkpoints" / "step-000002").mkdir()  # no state.json: an interrupted save
    temporary = tmp_path / "checkpoints" / ".step-000004.abc.tmp"
    temporary.mkdir()
    (temporary / run_layout.STATE).write_text("{}")
    assert run_layout.list_checkpoints(tmp_path) == [first, third]
    assert run_layout.list_checkpoints(tmp_path / "elsewhere") == []


def test_resolve_checkpoint_finds_the_best_else_the_last(tmp_path):
    first = make_checkpoint(tmp_path, 1)
    assert run_layout.resolve_checkpoint(first) == first
    second = make_checkpoint(tmp_path, 2)
    assert run_layout.resolve_checkpoint(tmp_path) == second  # no best recorded: the last
    make_checkpoint(tmp_path, 3, best="step-000001")
    assert run_layout.resolve_checkpoint(tmp_path) == first
    # Older runs wrote the best as a path; its name is what counts.
    make_checkpoint(tmp_path, 4, best=str(Path("/elsewhere/checkpoints/step-000002")))
    assert run_layout.resolve_checkpoint(tmp_path) == second
    # A best that was deleted falls back to the last.
    last = make_checkpoint(tmp_path, 5, best="step-000000")
    assert run_layout.resolve_checkpoint(tmp_path) == last


def test_resolve_checkpoint_on_an_empty_directory_names_run_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="RUN_DIR"):
        run_layout.resolve_checkpoint(tmp_path)
