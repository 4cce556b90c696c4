"""The coop scorer on a task written in CooperBench's convention (tests/data/cooperbench): its runner
``cd``s to /workspace/repo and reads /patches/NAME, unchanged, in a private mount namespace (real
``unshare``, real git, real subprocesses) or in the task's Docker image (a real daemon, where one
answers and the local base image exists: scripts/coop_test_image.sh); the choice of runner, the
network hint, and the loader's checks of a task folder.

Stand-ins, named: a machine without Docker or without mount namespaces is stood in for by setting the
two availability probes to False (the error paths); everything else runs for real."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scope_marl.cli import app
from scope_marl.envs.coop import Limits, Scorer, TaskError, load_task, load_tasks, runtimes
from scope_marl.envs.coop import docker as coop_docker
from scope_marl.envs.coop.sandbox import mount_namespace_available

DATA = Path(__file__).resolve().parent / "data" / "cooperbench"
TASK = DATA / "wordkit_task" / "task1"
REPO = DATA / "wordkit"  # the upstream repository at the task's base commit, outside the task folder as in CooperBench
BASE_IMAGE = "scope-coop-test-base:bookworm"

needs_namespace = pytest.mark.skipif(
    not mount_namespace_available(),
    reason="this machine refuses a private mount namespace (unshare --mount / unshare -rm), which the namespace runner needs",
)


def _score(*args: str, task: Path = TASK, runtime: str = "local") -> tuple[dict, str]:
    """``scope coop score`` through the CLI: its JSON (stdout) and its stderr."""
    result = CliRunner().invoke(app, ["coop", "score", str(task), "--repo", str(REPO), "--runtime", runtime, *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), result.stderr


def _pair(a: int, b: int, task: Path = TASK, runtime: str = "local", patches: tuple[Path, Path] | None = None) -> tuple[dict, str]:
    first, second = patches or (TASK / f"feature{a}" / "feature.patch", TASK / f"feature{b}" / "feature.patch")
    return _score("--features", f"{a},{b}", "--patches", str(first), str(second), task=task, runtime=runtime)


# ---- the four outcomes, through the CLI, in a mount namespace ------------------------------------------


@needs_namespace
@pytest.mark.parametrize("pair", [(1, 2), (2, 3)])
def test_gold_pairs_merge_and_pass_with_the_runner_unchanged(pair):
    out, err = _pair(*pair)
    assert out["merge"] == "clean" and out["success"] is True, out
    for feature in out["features"].values():
        assert feature["passed"] and feature["tests_run"] == 2 and feature["runner"] == "namespace"
        assert "output_tail" not in feature  # only a failure carries its output
    assert out["sandbox_network"] == "namespace+guard"
    assert "runner: namespace" in err and "network: denied" in err


@needs_namespace
def test_the_conflicting_pair_fails_as_cooperbench_scores_it():
    """Features 1 and 3 both insert after word_count: a plain merge conflicts, so the first patch alone
    is tested against both features; it holds feature 1 only."""
    out, _ = _pair(1, 3)
    assert out["merge"] == "conflict" and out["conflict_files"] == ["wordkit/core.py"] and out["success"] is False
    assert out["features"]["1"]["passed"] is True
    three = out["features"]["3"]
    assert three["passed"] is False and three["exit_code"] != 0
    assert "cannot import name 'title_words'" in three["output_tail"]  # the user sees why
    assert len(three["output_tail"].splitlines()) <= 40


@needs_namespace
def test_an_empty_patch_fails_its_feature(tmp_path):
    empty = tmp_path / "empty.patch"
    empty.write_text("")
    out, _ = _pair(1, 2, patches=(empty, TASK / "feature2" / "feature.patch"))
    assert out["apply"]["1"] == "skipped"
    assert out["features"]["1"]["passed"] is False and "count_vowels" in out["features"]["1"]["output_tail"]
    assert out["features"]["2"]["passed"] is True
    assert out["success"] is False


def _task_copy(tmp_path: Path, runner_edit=None) -> Path:
    folder = tmp_path / "wordkit_task" / "task1"
    shutil.copytree(TASK, folder)
    if runner_edit is not None:
        runner = folder / "runner.sh"
        runner.write_text(runner_edit(runner.read_text()))
    return folder


def _with_pip(text: str) -> str:
    return text.replace("python -m unittest", "pip install -e .\npython -m unittest")


@needs_namespace
def test_a_runner_that_needs_pip_fails_without_the_network_and_the_error_names_it(tmp_path):
    folder = _task_copy(tmp_path, _with_pip)
    out, err = _pair(1, 2, task=folder)
    assert "network: denied" in err
    for feature in out["features"].values():
        assert feature["passed"] is False and feature["tests_run"] == 0
        assert "pip" in feature["output_tail"]
        assert '"network": "allow"' in feature["hint"] and "--network allow" in feature["hint"]


@needs_namespace
def test_the_network_option_comes_from_the_task_and_the_command_line(tmp_path):
    folder = _task_copy(tmp_path)
    assert Scorer().network_allowed(load_task(folder, REPO)) is False
    (folder / "coop.json").write_text(json.dumps({"network": "allow"}))
    task = load_task(folder, REPO)
    assert Scorer().network_allowed(task) is True and Scorer(network="deny").network_allowed(task) is False
    (folder / "coop.json").write_text(json.dumps({"network": "sometimes"}))
    with pytest.raises(TaskError, match="network 'sometimes'"):
        load_task(folder, REPO)


@needs_namespace
def test_the_namespace_is_private_and_the_callers_python_is_read_only(tmp_path):
    """What the runner sees: /workspace/repo a git checkout of the base commit, /patches read-only, a
    throwaway venv as its Python, this environment's folders read-only; none of it outside."""
    site_packages = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    probe = f"""#!/bin/bash
cd /workspace/repo
git log --oneline | wc -l | sed 's/^/commits=/'
ls /patches | tr '\\n' ' ' | sed 's/^/patches=/'; echo
touch /patches/x 2>/dev/null && echo patches=writable || echo patches=read-only
touch {site_packages}/scope-probe 2>/dev/null && echo host=writable || echo host=read-only
python -c 'import sys, wordkit; print("prefix=" + sys.prefix)'
echo "Ran 1 test in 0.0s"
"""
    folder = _task_copy(tmp_path, lambda _: probe)
    out, _ = _score("--features", "1,2", "--solo", str(TASK / "feature1" / "feature.patch"), "--output", task=folder)
    text = out["features"]["1"]["output"]
    assert "commits=1" in text and "patches=feature.patch tests.patch" in text
    assert "patches=read-only" in text and "host=read-only" in text
    prefix = next(line for line in text.splitlines() if line.startswith("prefix="))
    assert prefix != f"prefix={sys.prefix}" and "/venv" in prefix
    assert not (Path(site_packages) / "scope-probe").exists()
    assert not Path("/patches").exists()


@needs_namespace
def test_a_runner_that_never_ends_is_killed_at_the_limit(tmp_path):
    folder = _task_copy(tmp_path, lambda _: "#!/bin/bash\ncd /workspace/repo\nsleep 600\n")
    scorer = Scorer(Limits(seconds=2), runtime="local")
    task = load_task(folder, REPO)
    score = scorer.score_solo(task, (1,), task.feature(1).patch)
    result = score.features[1]
    assert result.timed_out and not result.passed and result.runner == "namespace"


# ---- which runner, and the errors when it cannot run -------------------------------------------------------


def test_the_runner_follows_the_tasks_convention_and_the_runtime(monkeypatch):
    cooperbench = load_task(TASK, REPO)
    built_in = load_tasks()[0]
    assert runtimes.container_convention(cooperbench) and not runtimes.container_convention(built_in)
    monkeypatch.setattr(coop_docker, "daemon_answers", lambda: False)  # stand-in: a machine without Docker
    assert runtimes.choose(built_in, "auto") == "direct" and runtimes.choose(built_in, "local") == "direct"
    if mount_namespace_available():
        assert runtimes.choose(cooperbench, "auto") == "namespace"
    with pytest.raises(runtimes.RuntimeUnavailable, match="no Docker daemon answers"):
        runtimes.choose(cooperbench, "docker")
    with pytest.raises(runtimes.RuntimeUnavailable, match="has none; use --runtime local"):
        runtimes.choose(built_in, "docker")
    monkeypatch.setattr(coop_docker, "daemon_answers", lambda: True)
    assert runtimes.choose(cooperbench, "auto") == "docker" and runtimes.choose(built_in, "auto") == "direct"
    assert runtimes.choose(cooperbench, "docker") == "docker"


def test_a_machine_without_mount_namespaces_gets_the_fix_not_a_silent_direct_run(monkeypatch):
    monkeypatch.setattr(runtimes, "mount_namespace_available", lambda: False)  # stand-in for such a kernel
    monkeypatch.setattr(coop_docker, "daemon_answers", lambda: False)
    result = CliRunner().invoke(
        app, ["coop", "score", str(TASK), "--repo", str(REPO), "--features", "1,2", "--solo", str(TASK / "feature1" / "feature.patch")]
    )
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "written for CooperBench's container" in result.output and "--runtime docker" in result.output


def test_docker_runs_a_feature_as_cooperbench_does():
    """The command line of one feature (tested for real below where a daemon answers)."""
    command = coop_docker.run_command(
        "scope-coop/w:1", Path("/tmp/p"), ["tests.patch", "feature.patch"], Limits(memory_mb=512), False, "c1"
    )
    assert command[:4] == ["docker", "run", "--rm", "--name"]
    assert command[command.index("--volume") + 1] == "/tmp/p:/patches:ro"
    assert command[command.index("--memory") + 1] == "512m" and command[command.index("--network") + 1] == "none"
    assert command[-3:] == ["scope-coop/w:1", "tests.patch", "feature.patch"]
    assert "--network" not in coop_docker.run_command("i", Path("/p"), [], Limits(), True, "c2")


# ---- the loader's checks --------------------------------------------------------------------------------------


def test_the_loader_names_the_file_a_task_lacks_or_a_patch_that_leaves_the_repository(tmp_path):
    folder = _task_copy(tmp_path)
    (folder / "feature2" / "tests.patch").unlink()
    with pytest.raises(TaskError, match=r"feature2 lacks tests\.patch"):
        load_task(folder, REPO)
    shutil.copy(TASK / "feature2" / "tests.patch", folder / "feature2" / "tests.patch")
    evil = (TASK / "feature3" / "feature.patch").read_text().replace("wordkit/core.py", "../../etc/core.py")
    (folder / "feature3" / "feature.patch").write_text(evil)
    with pytest.raises(TaskError, match=r"feature3/feature\.patch names files outside the repository \(\.\./\.\./etc/core\.py\)"):
        load_task(folder, REPO)
    (folder / "feature3" / "feature.patch").write_text((TASK / "feature3" / "feature.patch").read_text())
    (folder / "runner.sh").unlink()
    with pytest.raises(TaskError, match="has no runner.sh"):
        load_task(folder, REPO)


# ---- Docker, for real ---------------------------------------------------------------------------------------------


def _docker_ready() -> str | None:
    if not coop_docker.daemon_answers():
        return "no Docker daemon answers here"
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True).returncode != 0:
        return f"no {BASE_IMAGE} image (build it with scripts/coop_test_image.sh; .ci/run does)"
    return None


@pytest.mark.integration
@pytest.mark.skipif(_docker_ready() is not None, reason=str(_docker_ready()))
def test_docker_builds_the_image_once_and_scores_like_the_namespace(tmp_path):
    folder = _task_copy(tmp_path)
    shutil.copytree(REPO, folder / "repo")  # the fixture's Dockerfile copies the repository from its build context
    task = load_task(folder)
    tag = coop_docker.image_tag(task)
    subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)
    gold, err = _pair(1, 2, task=folder, runtime="auto")
    assert "runner: docker (--runtime auto)" in err
    assert gold["success"] is True and {f["runner"] for f in gold["features"].values()} == {"docker"}
    assert gold["sandbox_network"] == "docker-none"
    created = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True, text=True).stdout
    conflict, _ = _pair(1, 3, task=folder, runtime="docker")
    assert conflict["merge"] == "conflict" and conflict["features"]["1"]["passed"] and not conflict["features"]["3"]["passed"]
    assert subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True, text=True).stdout == created
    # an edited runner is a new build context: a new image, never the stale one
    (folder / "runner.sh").write_text((folder / "runner.sh").read_text().replace("set -e", "set -e\necho edited-runner"))
    edited, _ = _score("--features", "1,2", "--solo", str(TASK / "feature1" / "feature.patch"), "--output", task=folder, runtime="docker")
    assert "edited-runner" in edited["features"]["1"]["output"]
    subprocess.run(["docker", "image", "rm", "-f", coop_docker.image_tag(load_task(folder))], capture_output=True)
