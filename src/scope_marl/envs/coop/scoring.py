"""Scoring two patches on a task as CooperBench scores them.

1. Test files are filtered out of each patch (they would collide with the hidden tests).
2. Each patch goes on its own branch from the base commit (``git apply``, retried with ``--3way``).
3. A plain ``git merge --no-commit --no-ff`` of the first branch into the second; no union fallback
   (a union merge only when asked for, ``merge="union"``: every conflict resolved by keeping both
   sides' lines).
4. On a clean merge, each feature's hidden tests run on the merged tree; on a conflict, the first
   patch alone is tested against both features (so the pair cannot pass unless that patch holds both
   features).
5. A feature passes when its runner (``runner.sh TESTS_PATCH FEATURE_PATCH`` in a fresh copy of the
   base tree) exits 0 having run at least one test. Each run is sandboxed (``sandbox.py``).

``success`` means every feature passed. The solo setting scores one patch against both features.
"""

from __future__ import annotations

import io
import shutil
import tarfile
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from scope_marl.envs.coop.git import GitError, apply, archive, clone, diff_from_head, filter_test_files, git, init_base, unsafe_paths
from scope_marl.envs.coop.sandbox import Limits, RunResult, namespace_available, run_sandboxed
from scope_marl.envs.coop.tasks import CoopTask

MERGES = ("plain", "union")


class PatchError(ValueError):
    """A patch the scorer refuses: it names paths outside its tree, or it does not apply."""


@dataclass
class FeatureResult:
    passed: bool
    tests_run: int
    exit_code: int | None
    timed_out: bool
    output: str = field(repr=False, default="")


@dataclass
class Score:
    merge: Literal["clean", "conflict"]
    conflict_files: list[str]
    features: dict[int, FeatureResult]
    apply: dict[str, str]  # per patch: applied | skipped
    network: str = ""

    @property
    def success(self) -> bool:
        return all(f.passed for f in self.features.values())

    @property
    def passed_fraction(self) -> float:
        return sum(f.passed for f in self.features.values()) / len(self.features)

    def as_json(self, output: bool = False) -> dict:
        """What ``scope coop score`` prints (test output only when asked)."""
        feats = {}
        for n, f in self.features.items():
            d = asdict(f)
            if not output:
                d.pop("output")
            feats[str(n)] = d
        return {
            "merge": self.merge,
            "conflict_files": self.conflict_files,
            "features": feats,
            "success": self.success,
            "apply": self.apply,
            "sandbox_network": self.network,
        }


class BaseRepos:
    """Each task's upstream tree as a git repository with one reproducible commit, made once per
    process in a temporary folder that goes away with it."""

    def __init__(self) -> None:
        self._dir: tempfile.TemporaryDirectory | None = None
        self._repos: dict[Path, tuple[Path, str]] = {}

    def get(self, task: CoopTask) -> tuple[Path, str]:
        key = task.repo.resolve()
        if key not in self._repos:
            if self._dir is None:
                self._dir = tempfile.TemporaryDirectory(prefix="scope-coop-base-")
            dest = Path(self._dir.name) / f"base{len(self._repos)}"
            self._repos[key] = (dest, init_base(task.repo, dest))
        return self._repos[key]

    def __getstate__(self):  # a pickled environment (a Ray worker) makes its own
        return {"_dir": None, "_repos": {}}


def _export(base: Path, commit: str, dest: Path) -> None:
    """The base commit's files at ``dest`` (no history), with an empty repository so git apply works there."""
    with tarfile.open(fileobj=io.BytesIO(archive(base, commit))) as tar:
        tar.extractall(dest, filter="data")
    git(["init", "-q"], dest)


class Scorer:
    """Scores patches on tasks; one instance keeps the base repositories it has made."""

    def __init__(self, limits: Limits = Limits(), merge: str = "plain", bases: BaseRepos | None = None):
        if merge not in MERGES:
            raise ValueError(f"merge must be one of {', '.join(MERGES)}, got {merge!r}")
        self.limits = limits
        self.merge = merge
        self.bases = bases or BaseRepos()

    # ---- CooperBench's steps ------------------------------------------------------------------
    def _checked(self, patch: str, label: str) -> str:
        bad = unsafe_paths(patch)
        if bad:
            raise PatchError(
                f"{label} writes outside its working copy ({', '.join(bad)}); patches may only name paths inside the repository"
            )
        return filter_test_files(patch)

    def run_feature(self, task: CoopTask, feature: int, patch: str, workdir: Path) -> FeatureResult:
        """The feature's hidden tests on the base tree with ``patch`` applied, sandboxed."""
        base, commit = self.bases.get(task)
        run = Path(tempfile.mkdtemp(prefix=f"f{feature}-", dir=workdir))
        tree = run / "tree"
        tree.mkdir()
        _export(base, commit, tree)
        (run / "tests.patch").write_text(task.feature(feature).tests_patch)
        (run / "feature.patch").write_text(patch)
        result: RunResult = run_sandboxed(
            ["bash", str(task.runner.resolve()), str(run / "tests.patch"), str(run / "feature.patch")], tree, self.limits
        )
        ran = result.tests_run
        shutil.rmtree(run, ignore_errors=True)
        return FeatureResult(result.exit_code == 0 and ran >= 1, ran, result.exit_code, result.timed_out, result.output)

    def score_pair(self, task: CoopTask, features: tuple[int, int], patches: tuple[str, str]) -> Score:
        """Two seats' patches, each implementing one of ``features`` (first patch: first feature)."""
        for n in features:
            task.feature(n)
        first, second = (self._checked(p, f"patch {i}") for i, p in enumerate(patches, 1))
        base, commit = self.bases.get(task)
        with tempfile.TemporaryDirectory(prefix="scope-coop-score-") as tmp:
            work = Path(tmp) / "repo"
            clone(base, work)
            status = {}
            for name, patch in (("agent1", first), ("agent2", second)):
                git(["checkout", "-q", "-B", name, commit], work)
                try:
                    status[name] = apply(work, patch)
                except GitError as err:
                    raise PatchError(f"patch {name[-1]} does not apply to the task's base commit: {err}") from None
                git(["add", "-A"], work)
                git(["commit", "-q", "--allow-empty", "-m", name], work)
            if self.merge == "union":
                (work / ".git" / "info" / "attributes").write_text("* merge=union\n")
            merged = git(["merge", "agent1", "--no-commit", "--no-ff"], work, check=False)
            conflicts: list[str] = []
            if merged.returncode == 0:
                tested = git(["diff", "--cached", "--binary", commit], work).stdout
            else:
                conflicts = sorted(git(["diff", "--name-only", "--diff-filter=U"], work).stdout.split())
                git(["merge", "--abort"], work, check=False)
                tested = first  # CooperBench: the first patch alone against both features
            results = {n: self.run_feature(task, n, tested, Path(tmp)) for n in features}
        return Score("conflict" if conflicts else "clean", conflicts, results, dict(zip(("1", "2"), status.values())), _network())

    def score_solo(self, task: CoopTask, features: tuple[int, ...], patch: str) -> Score:
        """One patch that should implement every feature in ``features``."""
        for n in features:
            task.feature(n)
        patch = self._checked(patch, "the patch")
        base, _ = self.bases.get(task)
        with tempfile.TemporaryDirectory(prefix="scope-coop-score-") as tmp:
            work = Path(tmp) / "repo"
            clone(base, work)
            try:
                status = apply(work, patch)
            except GitError as err:
                raise PatchError(f"the patch does not apply to the task's base commit: {err}") from None
            tested = diff_from_head(work)
            results = {n: self.run_feature(task, n, tested, Path(tmp)) for n in features}
        return Score("clean", [], results, {"1": status}, _network())


def _network() -> str:
    return "namespace+guard" if namespace_available() else "guard"
