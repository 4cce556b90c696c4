"""Running untrusted test code: a subprocess with time, memory, file-size and output limits, and no
network unless a task allows it.

What a run gets:

- **its own process group**, killed with SIGKILL at the wall-clock limit (an endless loop costs
  ``seconds`` and no more; the caller's batch goes on);
- **rlimits**: address space (``memory_mb``), CPU seconds, the size of any file it writes;
- **output capped** at ``output_bytes`` (stdout and stderr go to one file outside the tree, read back
  up to the cap; the file-size limit stops a flood before it fills the disk);
- **no network** (unless ``network=True``): a new network namespace (``unshare -rn``, only a downed
  loopback inside) where the kernel allows one, and always a Python-level guard (``sitecustomize``
  that makes every socket connect, bind and name lookup raise). ``RunResult.network`` says which held;
- **a scrubbed environment**: PATH to this Python and the system's tools, HOME inside the run's
  folder, no inherited secrets.

Two ways to start a task's ``runner.sh`` (``scope_marl.envs.coop.runtimes`` picks one per task):

- :func:`run_sandboxed`, **direct**: the runner runs in the tree under test, given the patches'
  paths (the built-in tasks' runners);
- :func:`run_in_workspace`, **namespace**: CooperBench's container convention without a container.
  Its runners ``cd /workspace/repo`` and read ``/patches/NAME``; in a private mount namespace
  (``unshare --mount``, in a user namespace ``unshare -rm`` when not root) a new root is built from
  bind mounts of the real one, with the tree under test at ``/workspace/repo`` and the patches at
  ``/patches`` (read-only), for that process only: nothing appears on the real ``/``. The runner gets
  a throwaway Python environment of its own (a venv that sees this one's packages), so a runner
  that ``pip install``s changes that venv, never the caller's; the caller's Python folders are
  read-only inside.

It is a sandbox for honest-but-buggy code (an agent's patch, a test that loops, a runner that
installs packages), not a security boundary against a hostile program: files outside the tree stay
readable.
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import resource
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import tempfile
import time
import venv
from collections.abc import Callable
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

# Run inside the new mount namespace, before the runner: a new root on a tmpfs holding a bind mount of
# every top-level folder of the real one (symbolic links such as /bin -> usr/bin copied), the tree
# under test at /workspace/repo, the patches read-only at /patches and the caller's Python folders
# read-only; then chroot into it. Nothing of this is visible outside the namespace (unshare makes its
# mounts private), and the tmpfs goes away with the namespace's last process.
WORKSPACE_SETUP = r"""
set -e
root="$1"; repo="$2"; patches="$3"; shift 3
mount -t tmpfs scope-coop-root "$root"
for entry in /*; do
    name="${entry#/}"
    if [ -L "$entry" ]; then
        ln -s "$(readlink "$entry")" "$root/$name"
    elif [ -d "$entry" ] && [ "$name" != workspace ] && [ "$name" != patches ]; then
        mkdir "$root/$name"
        mount --rbind "$entry" "$root/$name"
    fi
done
mkdir -p "$root/workspace/repo" "$root/patches"
mount --bind "$repo" "$root/workspace/repo"
mount --bind "$patches" "$root/patches"
mount -o remount,bind,ro "$root/patches"
for folder in $SCOPE_READONLY; do
    if [ -d "$root$folder" ]; then
        mount --bind "$root$folder" "$root$folder"
        mount -o remount,bind,ro "$root$folder"
    fi
done
unset SCOPE_READONLY
exec chroot "$root" /bin/bash -c 'cd /workspace/repo && exec "$@"' runner "$@"
"""

SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"


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
    network: str  # what held: "namespace+guard", "guard", "allowed" or "docker-none"

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


def _unshare_works(*flags: str) -> bool:
    try:
        return subprocess.run(["unshare", *flags, "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@functools.cache
def namespace_available() -> bool:
    """Whether ``unshare -rn`` works here (user and network namespaces allowed)."""
    return _unshare_works("-rn")


def _mount_flags() -> list[str]:
    """unshare's flags for a private mount namespace: as root a plain one, otherwise inside a user
    namespace (where this user is root)."""
    return ["--mount"] if os.geteuid() == 0 else ["-r", "--mount"]


@functools.cache
def mount_namespace_available() -> bool:
    """Whether this process may make a private mount namespace (``unshare --mount`` as root,
    ``unshare -rm`` otherwise); kernels or containers that forbid user namespaces refuse it."""
    return _unshare_works(*_mount_flags())


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


def _environment(home: Path, network: bool, path_first: str = "") -> dict[str, str]:
    env = {
        "PATH": f"{path_first or Path(sys.executable).parent}:{SYSTEM_PATH}",
        "HOME": str(home),
        "TMPDIR": str(home),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CEILING_DIRECTORIES": str(home.parent),
        "PIP_NO_INPUT": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    if not network:
        env["PYTHONPATH"] = _guard_dir()
        env["PIP_RETRIES"] = "0"  # without a network, pip's retries only add minutes to a certain failure
    return env


def run_limited(
    command: list[str],
    cwd: Path,
    env: dict[str, str],
    limits: Limits,
    network: str,
    rlimits: bool = True,
    on_timeout: Callable[[], None] | None = None,
) -> RunResult:
    """Run ``command`` in its own process group with a wall-clock limit (and ``limits``' rlimits unless
    ``rlimits`` is false: a client whose work happens elsewhere, ``docker run``), its output captured up
    to the cap; ``on_timeout`` stops what the process started elsewhere. Never raises for what the
    command does."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            preexec_fn=_limit(limits) if rlimits else None, start_new_session=True,
        )  # fmt: skip
        timed_out = False
        try:
            code: int | None = proc.wait(timeout=limits.seconds)
        except subprocess.TimeoutExpired:
            timed_out = True
            code = None
            if on_timeout is not None:
                on_timeout()
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


def run_sandboxed(command: list[str], cwd: Path, limits: Limits = Limits(), network: bool = False) -> RunResult:
    """Run ``command`` in ``cwd`` under ``limits`` (no network unless ``network``); never raises for
    what the command does."""
    cwd = Path(cwd)
    env = _environment(cwd, network)
    held = "allowed"
    if not network:
        held = "guard"
        if namespace_available():
            command = ["unshare", "-rn", *command]
            held = "namespace+guard"
    return run_limited(command, cwd, env, limits, held)


def throwaway_python(dest: Path) -> Path:
    """A venv at ``dest`` that sees this environment's packages (a ``.pth`` file) and has ``pip`` as
    this environment's pip run by the venv's Python, so installs land in the venv; returns its bin/."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(dest)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(dest), "platbase": str(dest)}))
    purelib.mkdir(parents=True, exist_ok=True)
    (purelib / "_scope_coop_host.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    bin_dir = dest / "bin"
    for name in ("pip", "pip3"):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec "{bin_dir / "python"}" -m pip "$@"\n')
        shim.chmod(0o755)
    return bin_dir


def _readonly_python_folders() -> list[str]:
    """The caller's Python installation and environment, made read-only for a runner."""
    folders = {sys.prefix, sys.base_prefix, *site.getsitepackages()}
    return sorted(f for f in folders if f and f != "/" and Path(f).is_dir())


def run_in_workspace(runner: Path, args: list[str], repo: Path, patches: Path, scratch: Path, limits: Limits, network: bool) -> RunResult:
    """``bash runner ARGS`` in CooperBench's container convention: ``repo`` at ``/workspace/repo`` and
    ``patches`` at ``/patches`` in a private mount namespace (and a network namespace unless
    ``network``), under ``limits``; ``scratch`` holds the new root's mount point, HOME and the
    runner's venv. Never raises for what the runner does; the caller checks
    :func:`mount_namespace_available` first."""
    scratch = Path(scratch)
    home = scratch / "home"
    mountpoint = scratch / "root"
    home.mkdir()
    mountpoint.mkdir()
    bin_dir = throwaway_python(scratch / "venv")
    env = _environment(home, network, path_first=str(bin_dir))
    env["VIRTUAL_ENV"] = str(scratch / "venv")
    env["SCOPE_READONLY"] = " ".join(_readonly_python_folders())
    flags, held = _mount_flags(), "allowed"
    if not network:
        flags, held = [*flags, "--net"], "namespace+guard"  # a mount namespace allowed here, a network one is too
    command = [
        "unshare",
        *flags,
        "bash",
        "-c",
        WORKSPACE_SETUP,
        "setup",
        str(mountpoint),
        str(repo),
        str(patches),
        "bash",
        str(runner.resolve()),
        *args,
    ]
    return run_limited(command, scratch, env, limits, held)
