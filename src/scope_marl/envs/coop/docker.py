"""A task's runner in its own Docker image, as CooperBench's evaluation runs it.

The image is built once from the task folder's ``Dockerfile`` (the folder is the build context) and
tagged by a hash of that context (``scope-coop/<repo>-<task>:<12 hex>``): the Dockerfile and every
file it could copy (``runner.sh`` above all), so an edited one gets a new image and an unchanged
task is never rebuilt. Each feature then runs as
``docker run --rm -v PATCHDIR:/patches:ro IMAGE tests.patch feature.patch``: the image's entrypoint
is the task's runner. The sandbox's limits hold in the container's terms: ``--memory``, a file-size
ulimit, ``--network none`` unless the task allows the network, and the wall-clock limit (the
container is killed at it).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

from scope_marl.envs.coop.sandbox import Limits, RunResult, run_limited
from scope_marl.envs.coop.tasks import CoopTask

BUILD_TAIL_LINES = 30


class DockerError(RuntimeError):
    """Docker cannot run a task: no daemon, or the task's image does not build."""


@functools.cache
def daemon_answers() -> bool:
    """Whether a ``docker`` client is installed and its daemon answers (within 15 s)."""
    if shutil.which("docker") is None:
        return False
    try:
        probe = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, timeout=15)
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


def _context_digest(folder: Path) -> str:
    """A hash of every file's path and bytes under ``folder`` (each time: an edited runner is a new image at once)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def image_tag(task: CoopTask) -> str:
    """``scope-coop/<repo>-<task>:<the build context's hash>`` (docker's name rules: lower case, no '/' in the name's part)."""
    assert task.dockerfile is not None
    digest = _context_digest(task.folder.resolve())
    name = re.sub(r"[^a-z0-9._-]+", "-", task.name.lower().replace("/", "-")).strip("-.")
    return f"scope-coop/{name}:{digest}"


def build_command(task: CoopTask, tag: str) -> list[str]:
    assert task.dockerfile is not None
    return ["docker", "build", "--quiet", "--tag", tag, "--file", str(task.dockerfile), str(task.folder)]


def ensure_image(task: CoopTask) -> str:
    """The task's image tag, built first when no image has it."""
    tag = image_tag(task)
    if subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0:
        return tag
    build = subprocess.run(build_command(task, tag), capture_output=True, text=True)
    if build.returncode != 0:
        tail = "\n".join((build.stderr or build.stdout).strip().splitlines()[-BUILD_TAIL_LINES:])
        raise DockerError(
            f"the image of {task.name} does not build from {task.dockerfile} (docker build exited {build.returncode}):\n{tail}\n"
            "Fix the Dockerfile, or score without Docker: --runtime local (coop.runtime: local)"
        )
    return tag


def run_command(tag: str, patches: Path, args: list[str], limits: Limits, network: bool, name: str) -> list[str]:
    """The ``docker run`` of one feature: CooperBench's, with the sandbox's limits."""
    memory = f"{limits.memory_mb}m"
    size = limits.file_mb * 1024 * 1024
    command = ["docker", "run", "--rm", "--name", name, "--volume", f"{Path(patches).resolve()}:/patches:ro"]
    command += ["--memory", memory, "--memory-swap", memory, "--ulimit", f"fsize={size}:{size}"]
    if not network:
        command += ["--network", "none"]
    return [*command, tag, *args]


def run_in_container(tag: str, args: list[str], patches: Path, limits: Limits, network: bool) -> RunResult:
    """One feature's runner in the task's image ``tag`` (:func:`ensure_image`); never raises for what
    the runner does."""
    name = f"scope-coop-{uuid.uuid4().hex[:12]}"

    def kill() -> None:
        subprocess.run(["docker", "kill", name], capture_output=True)

    env = dict(os.environ)  # the docker client is ours (DOCKER_HOST, contexts); the runner's world is the container
    return run_limited(
        run_command(tag, patches, args, limits, network, name), patches.parent, env, limits,
        "allowed" if network else "docker-none", rlimits=False, on_timeout=kill,
    )  # fmt: skip
