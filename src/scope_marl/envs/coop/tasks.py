"""Cooperative-coding tasks in CooperBench's layout, and the built-in ones.

A task is a folder ``{repo}_task/task{id}/`` holding ``runner.sh`` and, per feature N,
``feature{N}/feature.md`` (the request), ``feature.patch`` (gold) and ``tests.patch`` (hidden
tests); the pairs are every two features. Its upstream tree is ``repo/`` inside the folder (the
built-in tasks) or any local path given to :func:`load_task` (a real CooperBench task, whose
repository is the upstream project at the task's fixed commit). A ``Dockerfile`` there is the task's
image (``--runtime docker``); an optional ``coop.json`` may say ``"network": "allow"`` for a runner
that must reach the network (pip installs; denied by default). Other files are ignored, as
CooperBench's own folders hold extras (``resolution_patches/``, ``feature.filtered.patch``). The
loader refuses a folder without ``runner.sh``, a feature without ``tests.patch``, and a patch that
names a path outside the repository, naming the file.

The built-in tasks add, per feature, ``visible.patch`` (tests a seat may run) and ``naive.patch``
(the feature written without regard to the partner), and per task ``coop.json``: the repository's
split and the pairs whose naive patches conflict under a plain merge. Their splits are by repository
and checked disjoint. Their source is ``data/coop/`` in the repository (ordinary files);
``scripts/generate_coop_tasks.py`` builds them into one archive the package ships,
``tasks.tar.gz`` beside this module, which :func:`builtin_tasks_dir` extracts once per archive
version into the machine's cache (``$SCOPE_CACHE/coop-tasks/<archive hash>/``).
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import re
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from scope_marl.envs.coop.git import unsafe_paths

PATCH_FILES = ("feature.patch", "tests.patch", "visible.patch", "naive.patch")  # a feature's patches (the last two: built-in tasks)
ARCHIVE = Path(__file__).with_name("tasks.tar.gz")  # the built-in tasks, written by scripts/generate_coop_tasks.py
SPLITS = ("train", "validation", "test")


class TaskError(ValueError):
    """A task folder that is not in CooperBench's layout, or a feature it does not have."""


@dataclass(frozen=True)
class Feature:
    number: int
    request: str  # feature.md, given to the seat verbatim
    patch: str  # gold
    tests_patch: str  # hidden tests
    visible_patch: str = ""  # tests the seat may run (built-in tasks)
    naive_patch: str = ""  # written without regard to the partner (built-in tasks)


@dataclass(frozen=True)
class CoopTask:
    name: str  # "{repo}/task{id}"
    folder: Path
    repo: Path  # the upstream tree at the fixed commit
    features: dict[int, Feature]
    split: str = "train"
    naive_conflicts: frozenset[tuple[int, int]] = field(default_factory=frozenset)
    network: str = "deny"  # coop.json's "network": "allow" for a runner that must reach one (pip installs)

    @property
    def runner(self) -> Path:
        return self.folder / "runner.sh"

    @property
    def dockerfile(self) -> Path | None:
        """The task's image recipe, CooperBench's ``Dockerfile`` (the folder is its build context)."""
        path = self.folder / "Dockerfile"
        return path if path.is_file() else None

    def pairs(self) -> list[tuple[int, int]]:
        return list(itertools.combinations(sorted(self.features), 2))

    def feature(self, number: int) -> Feature:
        if number not in self.features:
            raise TaskError(f"{self.name} has no feature {number}; it has {', '.join(map(str, sorted(self.features)))}")
        return self.features[number]


def builtin_tasks_dir() -> Path:
    """The built-in tasks as a folder of ``{repo}_task/task1/``: the package's archive extracted into
    ``$SCOPE_CACHE/coop-tasks/<its hash>/`` on first use, then reused.

    The folder appears whole or not at all: the archive is extracted into a temporary sibling, its
    files flushed to disk, then renamed into place. Of processes extracting at once, the first rename
    wins and the others drop their copies; a crash leaves only a temporary folder, never a half one.
    (Done here, neither with :func:`scope_marl.core.files.atomic_directory` nor with
    :func:`scope_marl.core.machine.scope_cache_dir`, whose rule it repeats: environments import only the
    core types, docs/architecture.md.)
    """
    data = ARCHIVE.read_bytes()
    cache = Path(os.environ.get("SCOPE_CACHE") or Path.home() / ".cache" / "scope_marl")
    target = cache / "coop-tasks" / hashlib.sha256(data).hexdigest()[:16]
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.extractall(tmp, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        for dirpath, _dirnames, filenames in os.walk(tmp):
            for name in [*filenames, "."]:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():  # not another process that finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def load_task(folder: str | Path, repo: str | Path | None = None) -> CoopTask:
    """Read one task folder; ``repo`` is its upstream tree (default: ``folder/repo``)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TaskError(f"task folder {folder} does not exist")
    repo = Path(repo) if repo is not None else folder / "repo"
    if not repo.is_dir():
        raise TaskError(f"{folder} has no repo/ folder; pass --repo PATH to the upstream repository at the task's fixed commit")
    if not (folder / "runner.sh").is_file():
        raise TaskError(f"{folder} has no runner.sh (CooperBench's runner: runner.sh TESTS_PATCH [FEATURE_PATCH])")
    features = {}
    for sub in sorted(folder.glob("feature*")):
        m = re.fullmatch(r"feature(\d+)", sub.name)
        if not m or not sub.is_dir():
            continue
        missing = [n for n in ("feature.md", "feature.patch", "tests.patch") if not (sub / n).is_file()]
        if missing:
            raise TaskError(f"{sub} lacks {', '.join(missing)} (each feature needs feature.md, feature.patch and tests.patch)")
        n = int(m.group(1))
        patches = {name: _read(sub / name) for name in PATCH_FILES}
        for name, text in patches.items():
            bad = unsafe_paths(text)
            if bad:
                raise TaskError(
                    f"{sub / name} names files outside the repository ({', '.join(bad)}); a patch may only name paths inside it"
                )
        features[n] = Feature(
            n,
            (sub / "feature.md").read_text(),
            patches["feature.patch"],
            patches["tests.patch"],
            patches["visible.patch"],
            patches["naive.patch"],
        )
    if len(features) < 2:
        raise TaskError(f"{folder} has {len(features)} feature folder(s); a task needs at least two (feature1/, feature2/, ...)")
    meta = json.loads((folder / "coop.json").read_text()) if (folder / "coop.json").is_file() else {}
    split = meta.get("split", "train")
    if split not in SPLITS:
        raise TaskError(f"{folder}/coop.json: split {split!r} is not one of {', '.join(SPLITS)}")
    network = meta.get("network", "deny")
    if network not in ("allow", "deny"):
        raise TaskError(f"{folder}/coop.json: network {network!r} is not allow or deny")
    repo_name = folder.parent.name.removesuffix("_task")
    conflicts = frozenset(tuple(sorted(p)) for p in meta.get("naive_conflicts", []))
    return CoopTask(f"{repo_name}/{folder.name}", folder, repo, features, split, conflicts, network)


def load_tasks(root: str | Path | None = None) -> list[CoopTask]:
    """Every ``*_task/task*/`` folder under ``root`` (default: the built-in tasks), sorted by name;
    the splits are checked disjoint by repository."""
    root = Path(root) if root is not None else builtin_tasks_dir()
    folders = sorted(p for p in root.glob("*_task/task*") if p.is_dir())
    if not folders:
        raise TaskError(f"no task folders ({{repo}}_task/task{{id}}/) under {root}")
    tasks = [load_task(f) for f in folders]
    by_repo: dict[str, set[str]] = {}
    for t in tasks:
        by_repo.setdefault(t.name.split("/")[0], set()).add(t.split)
    mixed = {r: s for r, s in by_repo.items() if len(s) > 1}
    if mixed:
        raise TaskError(f"repositories in more than one split: {mixed}; a repository's tasks must share one split")
    return tasks
