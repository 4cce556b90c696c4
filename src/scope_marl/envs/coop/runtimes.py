"""Where a task's ``runner.sh`` runs, picked per task, and why a failed run failed.

Three runners (the ``runner`` field of a scored feature):

- **direct**: the runner in the tree under test, given the patches' paths (``runner.sh
  /tmp/.../tests.patch /tmp/.../feature.patch``). The built-in tasks' runners are written so.
- **namespace**: CooperBench's container convention without a container (``sandbox.run_in_workspace``):
  the tree at ``/workspace/repo``, the patches at ``/patches``, the runner given their names
  (``runner.sh tests.patch feature.patch``). Used for a runner that names ``/workspace/repo`` or
  ``/patches``, which is how CooperBench's runners are written (for the task's container).
- **docker**: the task's own image (``docker.py``), as CooperBench's evaluation runs it.

What the user asks for (``--runtime``, ``coop.runtime``): ``auto`` (docker when a daemon answers and
the task has a Dockerfile, otherwise local), ``local`` (never docker: namespace or direct by the
runner's convention) or ``docker`` (an error when there is no daemon or no Dockerfile, never a
silent fallback).
"""

from __future__ import annotations

import re
from typing import Literal

from scope_marl.envs.coop import docker
from scope_marl.envs.coop.sandbox import mount_namespace_available
from scope_marl.envs.coop.tasks import CoopTask

RUNTIMES = ("auto", "local", "docker")
Runner = Literal["direct", "namespace", "docker"]
NETWORK_CHOICES = ("allow", "deny")

# What a run that wanted the network and had none prints: the sandbox's own guard, the kernel's words
# in a namespace without a network, name lookups, and pip's when it cannot reach an index.
_NETWORK_FAILURE = re.compile(
    r"network access is disabled in the coop sandbox|Network is unreachable|Temporary failure in name resolution"
    r"|Name or service not known|Could not resolve host|Failed to establish a new connection"
    r"|No matching distribution found|Could not find a version that satisfies the requirement"
)


class RuntimeUnavailable(ValueError):
    """The runtime asked for (or the one a task's runner needs) cannot run on this machine."""


def container_convention(task: CoopTask) -> bool:
    """Whether the task's runner is written for CooperBench's container (it names /workspace/repo or /patches)."""
    text = task.runner.read_text(errors="replace")
    return "/workspace/repo" in text or "/patches" in text


def choose(task: CoopTask, runtime: str) -> Runner:
    """The runner that scores ``task`` under the asked-for ``runtime``; RuntimeUnavailable (with the
    fix) when it cannot run here."""
    if runtime not in RUNTIMES:
        raise RuntimeUnavailable(f"runtime {runtime!r} is not one of {', '.join(RUNTIMES)}")
    if runtime == "docker":
        if task.dockerfile is None:
            raise RuntimeUnavailable(
                f"--runtime docker builds the task's image from its Dockerfile, and {task.folder} has none; use --runtime local"
            )
        if not docker.daemon_answers():
            raise RuntimeUnavailable(
                "--runtime docker: no Docker daemon answers here (docker version failed); start one (systemctl start docker) "
                "or use --runtime local"
            )
        return "docker"
    if runtime == "auto" and task.dockerfile is not None and docker.daemon_answers():
        return "docker"
    if not container_convention(task):
        return "direct"
    if not mount_namespace_available():
        raise RuntimeUnavailable(
            f"{task.runner} is written for CooperBench's container (it uses /workspace/repo and /patches); running it "
            "without one needs a private mount namespace (unshare --mount as root, unshare -rm otherwise), which this "
            "machine refuses. Allow user namespaces (sysctl kernel.unprivileged_userns_clone=1, or run as root), or "
            "score with Docker: --runtime docker"
        )
    return "namespace"


def network_hint(output: str) -> str | None:
    """When a run without the network failed and its output shows it tried to reach one, what to do."""
    found = _NETWORK_FAILURE.search(output)
    if found is None:
        return None
    return (
        f"the runner tried to reach the network ({found.group(0)!r}), which this task does not allow; if it must "
        '(a runner that pip-installs), allow it: "network": "allow" in the task\'s coop.json, or --network allow '
        "(coop.network: allow)"
    )
