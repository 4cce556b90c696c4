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


def test_a_held_checkpoint_outlives_pruning_and_one_pruned_before_it_is_held_is_chosen_again(tmp_path, monkeypatch):
    """scope eval on a run still training: the newest checkpoint is chosen, the run saves a newer one
    and prunes the chosen one before it is held; holding chooses again and holds the newer one, whose
    files then outlive the run's pruning of it too."""
    import shutil

    run = tmp_path / "run"
    make_checkpoint(run, 1)
    make_checkpoint(run, 2)
    real = run_layout._link_or_copy
    raced = []

    def racing(src: str, dst: str) -> None:
        if not raced:  # the run moves on between choosing and holding
            raced.append(src)
            (make_checkpoint(run, 3) / "weights.bin").write_bytes(b"w" * 64)
            shutil.rmtree(run_layout.checkpoint_dir(run, 2))
        real(src, dst)

    monkeypatch.setattr(run_layout, "_link_or_copy", racing)
    chosen, held = run_layout.hold_checkpoint(run, tmp_path / "hold")
    assert raced and chosen == run_layout.checkpoint_dir(run, 3) and held == tmp_path / "hold" / "step-000003"
    shutil.rmtree(chosen)  # pruned after it was held
    assert run_layout.read_state(held)["step"] == 3 and (held / "weights.bin").read_bytes() == b"w" * 64
    with pytest.raises(FileNotFoundError, match="neither a checkpoint directory"):
        run_layout.hold_checkpoint(tmp_path / "empty", tmp_path / "hold2")
