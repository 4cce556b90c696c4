"""Scoring two patches on a task as CooperBench scores them.

1. Test files are filtered out of each patch (they would collide with the hidden tests).
2. Each patch goes on its own branch from the base commit (``git apply``, retried with ``--3way``).
3. A plain ``git merge --no-commit --no-ff`` of the first branch into the second; no union fallback
   (a union merge only when asked for, ``merge="union"``: every conflict resolved by keeping both
   sides' lines).
4. On a clean merge, each feature's hidden tests run on the merged tree; on a conflict, the first
   patch alone is tested against both features (so the pair cannot pass unless that patch holds both
   features).
5. A feature passes when its runner (``runner.sh TESTS_PATCH FEATURE_PATCH`` on a fresh copy of the
   base tree) exits 0 having run at least one test. Each run is sandboxed, by the runner the task's
   convention and the asked-for runtime pick (``runtimes.py``: direct, namespace or docker).

``success`` means every feature passed. The solo setting scores one patch against both features.
"""

from __future__ import annotations

import io
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from scope_marl.envs.coop import runtimes
from scope_marl.envs.coop.docker import ensure_image, run_in_container
from scope_marl.envs.coop.git import GitError, apply, archive, clone, diff_from_head, filter_test_files, git, init_base, unsafe_paths
from scope_marl.envs.coop.sandbox import Limits, RunResult, run_in_workspace, run_sandboxed
from scope_marl.envs.coop.tasks import CoopTask

MERGES = ("plain", "union")
TAIL_LINES = 40  # of a failed feature's runner output, in the JSON


class PatchError(ValueError):
    """A patch the scorer refuses: it names paths outside its tree, or it does not apply."""


@dataclass
class FeatureResult:
    passed: bool
    tests_run: int
    exit_code: int | None
    timed_out: bool
    output: str = field(repr=False, default="")
    runner: str = "direct"  # direct | namespace | docker (runtimes.py)
    hint: str | None = None  # why it failed, when the output shows (the network it was denied)
    network: str = ""  # the network isolation that held (RunResult.network)

    def as_json(self, output: bool = False) -> dict:
        """The feature's JSON: always the verdict and the runner; a failure adds the last 40 lines of
        the runner's output (``output_tail``) and the hint, if any; ``output`` adds all of it."""
        d = {"passed": self.passed, "tests_run": self.tests_run, "exit_code": self.exit_code, "timed_out": self.timed_out}
        d["runner"] = self.runner
        if not self.passed:
            d["output_tail"] = "\n".join(self.output.rstrip().splitlines()[-TAIL_LINES:])
            if self.hint:
                d["hint"] = self.hint
        if output:
            d["output"] = self.output
        return d


@dataclass
class Score:
    merge: Literal["clean", "conflict"]
    conflict_files: list[str]
    features: dict[int, FeatureResult]
    apply: dict[str, str]  # per patch: applied | skipped

    @property
    def network(self) -> str:
        """The network isolation its runs had (sandbox.RunResult.network)."""
        return ", ".join(sorted({f.network for f in self.features.values()}))

    @property
    def success(self) -> bool:
        return all(f.passed for f in self.features.values())

    @property
    def passed_fraction(self) -> float:
        return sum(f.passed for f in self.features.values()) / len(self.features)

    def as_json(self, output: bool = False) -> dict:
        """What ``scope coop score`` prints (whole test output only when asked)."""
        return {
            "merge": self.merge,
            "conflict_files": self.conflict_files,
            "features": {str(n): f.as_json(output) for n, f in self.features.items()},
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
    """Scores patches on tasks; one instance keeps the base repositories it has made.

    ``runtime``: ``auto`` | ``local`` | ``docker`` (runtimes.py). ``network``: ``allow`` or ``deny``
    for every task, or None for each task's own (its coop.json; deny when it says nothing)."""

    def __init__(
        self,
        limits: Limits = Limits(),
        merge: str = "plain",
        bases: BaseRepos | None = None,
        runtime: str = "auto",
        network: str | None = None,
    ):
        if merge not in MERGES:
            raise ValueError(f"merge must be one of {', '.join(MERGES)}, got {merge!r}")
        if runtime not in runtimes.RUNTIMES:
            raise ValueError(f"runtime must be one of {', '.join(runtimes.RUNTIMES)}, got {runtime!r}")
        if network not in (None, *runtimes.NETWORK_CHOICES):
            raise ValueError(f"network must be allow or deny, got {network!r}")
        self.limits = limits
        self.merge = merge
        self.bases = bases or BaseRepos()
        self.runtime = runtime
        self.network = network

    def runner_for(self, task: CoopTask) -> str:
        """direct | namespace | docker: what will run ``task``'s runner (RuntimeUnavailable when none can)."""
        return runtimes.choose(task, self.runtime)

    def network_allowed(self, task: CoopTask) -> bool:
        return (self.network or task.network) == "allow"

    # ---- CooperBench's steps ------------------------------------------------------------------
    def _checked(self, patch: str, label: str) -> str:
        bad = unsafe_paths(patch)
        if bad:
            raise PatchError(
                f"{label} writes outside its working copy ({', '.join(bad)}); patches may only name paths inside the repository"
            )
        return filter_test_files(patch)

    def run_features(self, task: CoopTask, features: tuple[int, ...], patch: str, workdir: Path) -> dict[int, FeatureResult]:
        """Each feature's hidden tests with ``patch`` applied; the runner (and a docker runner's image,
        whose tag hashes the whole build context) is settled once for them all."""
        runner = self.runner_for(task)
        image = ensure_image(task) if runner == "docker" else None
        return {n: self.run_feature(task, n, patch, workdir, runner, image) for n in features}

    def run_feature(self, task: CoopTask, feature: int, patch: str, workdir: Path, runner: str, image: str | None = None) -> FeatureResult:
        """The feature's hidden tests on the base tree with ``patch`` applied, sandboxed by ``runner``
        (:meth:`runner_for`; ``image``: the task's, for docker)."""
        network = self.network_allowed(task)
        base, commit = self.bases.get(task)
        run = Path(tempfile.mkdtemp(prefix=f"f{feature}-", dir=workdir))
        patches = run / "patches"
        patches.mkdir()
        (patches / "tests.patch").write_text(task.feature(feature).tests_patch)
        (patches / "feature.patch").write_text(patch)
        names = ["tests.patch", "feature.patch"]
        try:
            if runner == "docker":
                result: RunResult = run_in_container(image, names, patches, self.limits, network)
            elif runner == "namespace":
                clone(base, run / "repo")  # a git checkout at the base commit: CooperBench's runners reset and clean it
                result = run_in_workspace(task.runner, names, run / "repo", patches, run, self.limits, network)
            else:
                tree = run / "tree"
                tree.mkdir()
                _export(base, commit, tree)
                result = run_sandboxed(["bash", str(task.runner.resolve()), *(str(patches / n) for n in names)], tree, self.limits, network)
        finally:
            shutil.rmtree(run, ignore_errors=True)
        ran = result.tests_run
        passed = result.exit_code == 0 and ran >= 1
        hint = None if passed or network else runtimes.network_hint(result.output)
        return FeatureResult(passed, ran, result.exit_code, result.timed_out, result.output, runner, hint, result.network)

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
            results = self.run_features(task, features, tested, Path(tmp))
        return Score("conflict" if conflicts else "clean", conflicts, results, dict(zip(("1", "2"), status.values())))

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
            results = self.run_features(task, features, tested, Path(tmp))
        return Score("clean", [], results, {"1": status})
