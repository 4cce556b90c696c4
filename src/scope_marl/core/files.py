"""The one atomic-write helper: a file or a directory is either whole-old or whole-new after a crash.

Everything is written under a temporary name in the same directory (so the final rename stays on
one file system), flushed and fsynced, then renamed over the target; the parent directory is
fsynced too, so the rename itself survives a power loss. A failure at any point removes the
temporary and leaves the target as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8", durable: bool = True) -> Iterator[IO[Any]]:
    """Open a temporary sibling of ``path`` for writing; on a clean exit it replaces ``path``.

    ``durable=False`` skips the fsyncs (the rename stays atomic, so readers still never see half a
    file; only a power loss may lose the newest version): for files rewritten many times a second.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as handle:
            yield handle
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        _fsync_directory(path.parent)


def write_text(path: str | os.PathLike, text: str, durable: bool = True) -> Path:
    with atomic_file(path, durable=durable) as handle:
        handle.write(text)
    return Path(path)


def write_json(path: str | os.PathLike, data: Any, indent: int | None = 2, durable: bool = True) -> Path:
    """``data`` as JSON with a final newline, atomically."""
    return write_text(path, json.dumps(data, indent=indent) + "\n", durable)


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as handle:
                os.fsync(handle.fileno())
        _fsync_directory(Path(dirpath))


@contextmanager
def atomic_directory(target: str | os.PathLike, if_exists: str = "replace") -> Iterator[Path]:
    """Yield an empty temporary sibling of ``target`` to fill; on a clean exit it becomes ``target``.

    ``if_exists`` says what happens when ``target`` is already there: ``replace`` removes it just
    before the rename (a crash between the two leaves no target, never a half-written one), and
    ``keep`` discards the new copy (another process finished first: keep theirs).
    """
    if if_exists not in ("replace", "keep"):
        raise ValueError(f"if_exists must be 'replace' or 'keep', got {if_exists!r}")
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
        _fsync_tree(tmp)
        if target.exists() and if_exists == "keep":
            shutil.rmtree(tmp)
            return
        if target.exists():
            shutil.rmtree(target)
        try:
            os.rename(tmp, target)
        except OSError:
            if if_exists == "keep" and target.exists():  # another process renamed its copy in first
                shutil.rmtree(tmp, ignore_errors=True)
                return
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_directory(target.parent)
