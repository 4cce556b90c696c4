"""One process per run directory: an OS file lock that dies with the process that holds it.

``scope train`` and ``scope train --resume`` take it before touching a run directory, so a second
process on the same run (two resumes, or a resume of a run that is still going) exits at once,
naming the holder, instead of interleaving metrics and checkpoints. The lock is ``fcntl.flock`` on
``RUN_DIR/.lock``: the kernel releases it when the holder exits or is killed, so a crash never
leaves a stale lock behind (the file stays, with the last holder's pid and host, and is reused).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from pathlib import Path

LOCK_FILE = ".lock"


class RunLocked(RuntimeError):
    """Another live process holds the run directory."""


class RunLock:
    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        if self.path.parent.exists() and not self.path.parent.is_dir():
            raise NotADirectoryError(f"{self.path.parent} is a file, not a run directory; name a folder")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunLocked(
                f"{self.path.parent} is in use by another process ({holder}); wait for it to finish or stop it, then run the command again"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode())
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {data['pid']} on {data['host']}"
    except (ValueError, KeyError, OSError):
        return "holder unknown"
