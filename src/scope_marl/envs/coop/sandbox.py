"""Running untrusted test code: a subprocess with time, memory, file-size and output limits, no network.

What a run gets:

- **its own process group**, killed with SIGKILL at the wall-clock limit (an endless loop costs
  ``seconds`` and no more; the caller's batch goes on);
- **rlimits**: address space (``memory_mb``), CPU seconds, the size of any file it writes;
- **output capped** at ``output_bytes`` (stdout and stderr go to one file outside the tree, read back
  up to the cap; the file-size limit stops a flood before it fills the disk);
- **no network**: a new network namespace (``unshare -rn``, only a downed loopback inside) where the
  kernel allows one, and always a Python-level guard (``sitecustomize`` that makes every socket
  connect, bind and name lookup raise). ``RunResult.network`` says which held for the run;
- **a scrubbed environment**: PATH to this Python and the system's tools, HOME inside the tree, no
  inherited secrets.

It is a sandbox for honest-but-buggy code (an agent's patch, a test that loops), not a security
boundary against a hostile program: files outside the tree stay readable.
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

GUARD = '''\
"""Installed by the coop sandbox: no test code may reach the network."""
import socket as _socket


def _blocked(*args, **kwargs):
    raise OSError("network access is disabled in the coop sandbox")


for _name in ("connect", "connect_ex", "bind", "sendto"):
    setattr(_socket.socket, _name, _blocked)
_socket.create_connection = _blocked
_socket.getaddrinfo = _blocked
_socket.gethostbyname = _blocked
'''


@dataclass(frozen=True)
class Limits:
    """What one sandboxed run may use."""

    seconds: float = 30.0
    memory_mb: int = 1024
    output_bytes: int = 65536
    file_mb: int = 64


@dataclass
class RunResult:
    exit_code: int | None  # None: killed at the time limit
    output: str  # stdout and stderr together, capped
    timed_out: bool
    seconds: float
    network: str  # "namespace+guard" or "guard"

    @property
    def tests_run(self) -> int:
        return tests_run(self.output)


def tests_run(output: str) -> int:
    """Tests a runner says it ran: unittest's "Ran N tests", else pytest's "N passed" / "N failed" / "N error"."""
    ran = re.findall(r"^Ran (\d+) tests? in", output, re.MULTILINE)
    if ran:
        return int(ran[-1])
    return sum(int(n) for n in re.findall(r"(\d+) (?:passed|failed|errors?)\b", output))


@functools.cache
def _guard_dir() -> str:
    path = Path(tempfile.mkdtemp(prefix="scope-coop-guard-"))
    (path / "sitecustomize.py").write_text(GUARD)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return str(path)


@functools.cache
def namespace_available() -> bool:
    """Whether ``unshare -rn`` works here (user and network namespaces allowed)."""
    try:
        return subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _limit(limits: Limits):
    def apply() -> None:
        memory = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        cpu = int(limits.seconds) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        size = limits.file_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run_sandboxed(command: list[str], cwd: Path, limits: Limits = Limits()) -> RunResult:
    """Run ``command`` in ``cwd`` under ``limits``; never raises for what the command does."""
    cwd = Path(cwd)
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(cwd),
        "TMPDIR": str(cwd),
        "LANG": "C.UTF-8",
        "PYTHONPATH": _guard_dir(),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CEILING_DIRECTORIES": str(cwd.parent),
    }
    network = "guard"
    if namespace_available():
        command = ["unshare", "-rn", *command]
        network = "namespace+guard"
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            preexec_fn=_limit(limits), start_new_session=True,
        )  # fmt: skip
        timed_out = False
        try:
            code: int | None = proc.wait(timeout=limits.seconds)
        except subprocess.TimeoutExpired:
            timed_out = True
            code = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # whatever it left running in its group
            except ProcessLookupError:
                pass
            proc.wait()
        out.seek(0)
        data = out.read(limits.output_bytes + 1)
    text = data[: limits.output_bytes].decode("utf-8", errors="replace")
    if len(data) > limits.output_bytes:
        text += f"\n[output cut at {limits.output_bytes} bytes]"
    if timed_out:
        text += f"\n[killed at the time limit of {limits.seconds:g} s]"
    return RunResult(code, text, timed_out, time.perf_counter() - started, network)
