"""Atomic files and directories (core.files): a write replaces the old content whole or not at all,
even when the writing process is killed mid-write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scope_marl.core.files import atomic_directory, atomic_file, write_json, write_text


def test_write_text_replaces_old_content_and_creates_parents(tmp_path):
    path = tmp_path / "a" / "b" / "note.txt"
    assert write_text(path, "old") == path
    write_text(path, "new, longer content")
    assert path.read_text() == "new, longer content"
    assert sorted(os.listdir(path.parent)) == ["note.txt"]


def test_write_json_ends_with_a_newline_and_round_trips(tmp_path):
    data = {"step": 3, "best": [0.5, "step-000002"], "name": "ünï"}
    path = write_json(tmp_path / "deep" / "state.json", data)
    text = path.read_text()
    assert text.endswith("}\n") and json.loads(text) == data
    assert write_json(tmp_path / "flat.json", [1, 2], indent=None).read_text() == "[1, 2]\n"


def test_an_error_inside_atomic_file_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(b"\x00old bytes\xff")
    with pytest.raises(RuntimeError, match="half way"), atomic_file(path, "wb") as handle:
        handle.write(b"new" * 1000)
        raise RuntimeError("half way")
    assert path.read_bytes() == b"\x00old bytes\xff"
    assert os.listdir(tmp_path) == ["data.bin"]

    with atomic_file(path, "wb", durable=False) as handle:
        handle.write(b"new")
    assert path.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["data.bin"]


@pytest.mark.integration
def test_a_process_killed_mid_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "state.json"
    old = json.dumps({"step": 1}) + "\n"
    path.write_text(old)
    script = (
        "import os, signal, sys\n"
        "from scope_marl.core.files import atomic_file\n"
        "with atomic_file(sys.argv[1]) as handle:\n"
        "    handle.write('x' * 3_000_000)\n"
        "    handle.flush()\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "    handle.write('y' * 3_000_000)\n"
    )
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", script, str(path)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert path.read_text() == old
    leftovers = [name for name in os.listdir(tmp_path) if name != "state.json"]
    assert leftovers, "the kill should have struck inside the with block, with the temporary written"
    for name in leftovers:
        assert name.startswith(".") and name.endswith(".tmp"), name
    # The temporary holds the first half: the process really died mid-write.
    assert (tmp_path / leftovers[0]).read_text() == "x" * 3_000_000


def fill(directory: Path, text: str) -> None:
    (directory / "sub").mkdir()
    (directory / "a.txt").write_text(text)
    (directory / "sub" / "b.txt").write_text(text * 2)


def tree(directory: Path) -> dict:
    return {str(p.relative_to(directory)): p.read_text() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_atomic_directory_replaces_an_existing_target(tmp_path):
    target = tmp_path / "parent" / "ckpt"
    with atomic_directory(target) as tmp:
        assert tmp.parent == target.parent and tmp.name.startswith(".ckpt.") and tmp.name.endswith(".tmp")
        assert list(tmp.iterdir()) == []
        fill(tmp, "old")
    assert tree(target) == {"a.txt": "old", "sub/b.txt": "oldold"}
    with atomic_directory(target, if_exists="replace") as tmp:
        (tmp / "only.txt").write_text("new")
    assert tree(target) == {"only.txt": "new"}
    assert os.listdir(target.parent) == ["ckpt"]


def test_atomic_directory_keep_leaves_the_existing_target(tmp_path):
    target = tmp_path / "member"
    with atomic_directory(target) as tmp:
        fill(tmp, "theirs")
    with atomic_directory(target, if_exists="keep") as tmp:
        fill(tmp, "mine")
    assert tree(target) == {"a.txt": "theirs", "sub/b.txt": "theirstheirs"}
    assert os.listdir(tmp_path) == ["member"]
    # With no target yet, keep still installs the new copy.
    with atomic_directory(tmp_path / "fresh", if_exists="keep") as tmp:
        fill(tmp, "mine")
    assert tree(tmp_path / "fresh") == {"a.txt": "mine", "sub/b.txt": "minemine"}


def test_an_error_inside_atomic_directory_keeps_the_old_directory(tmp_path):
    target = tmp_path / "ckpt"
    target.mkdir()
    fill(target, "old")
    with pytest.raises(KeyboardInterrupt), atomic_directory(target) as tmp:
        fill(tmp, "new")
        raise KeyboardInterrupt
    assert tree(target) == {"a.txt": "old", "sub/b.txt": "oldold"}
    assert os.listdir(tmp_path) == ["ckpt"]


def test_atomic_directory_rejects_an_unknown_if_exists(tmp_path):
    with pytest.raises(ValueError, match="if_exists must be 'replace' or 'keep'"), atomic_directory(tmp_path / "x", if_exists="merge"):
        pass
    assert os.listdir(tmp_path) == []
