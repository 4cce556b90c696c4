"""Cooperative coding (CooperBench-style): the generated tasks, the loader of CooperBench's layout,
the sandboxed scorer (real git, real subprocesses), the environment's seats and tools, and training
with a trainable partner."""

from __future__ import annotations

import filecmp
import gzip
import json
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scope_marl.backends.scripted import ScriptedChatModel
from scope_marl.backends.seat import Seat
from scope_marl.cli import app
from scope_marl.config import RolloutConfig, TrainConfig, load_config
from scope_marl.core.types import TOOL, EpisodeStatus, SamplingParams, ToolCall
from scope_marl.envs.base import AGENT, USER, role_view
from scope_marl.envs.coop import DONE, Coop, Limits, PatchError, Scorer, TaskError, load_task, load_tasks, run_sandboxed
from scope_marl.envs.coop.git import apply, clone, filter_test_files, init_base
from scope_marl.envs.coop.tasks import ARCHIVE, builtin_tasks_dir
from scope_marl.rollout import RolloutEngine
from scope_marl.simulators import FrozenSimulator

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tasks():
    return load_tasks()


@pytest.fixture(scope="module")
def scorer():
    return Scorer(Limits(seconds=20))


# ---- the generated tasks ---------------------------------------------------------------------------------


@pytest.mark.integration
def test_the_generator_reproduces_the_shipped_tasks_byte_for_byte(tmp_path):
    """The package's archive is what scripts/generate_coop_tasks.py builds from data/coop/, and its
    extracted folder is the built tree, file for file."""
    script = ROOT / "scripts" / "generate_coop_tasks.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "data"), "--archive", str(tmp_path / "tasks.tar.gz")], check=True)
    assert gzip.decompress((tmp_path / "tasks.tar.gz").read_bytes()) == gzip.decompress(ARCHIVE.read_bytes()), (
        "src/scope_marl/envs/coop/tasks.tar.gz is not what data/coop builds: python scripts/generate_coop_tasks.py"
    )
    shipped = builtin_tasks_dir()
    cmp = filecmp.dircmp(shipped, tmp_path / "data")

    def differences(c):
        out = c.left_only + c.right_only + c.diff_files + c.funny_files
        for sub in c.subdirs.values():
            out += differences(sub)
        return out

    assert differences(cmp) == []
    assert not list(shipped.rglob(".git")), "task trees are stored without a nested .git"
    check = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_built_in_tasks_are_extracted_once_whole_and_reused(tmp_path, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("SCOPE_CACHE", str(tmp_path))
    cache = tmp_path / "coop-tasks"
    cache.mkdir()
    (cache / ".0123456789abcdef.crashed.tmp").mkdir()  # what a crashed extraction leaves: never read
    with ThreadPoolExecutor(4) as pool:  # extractions at once: one folder wins, the others are dropped
        folders = set(pool.map(lambda _: builtin_tasks_dir(), range(4)))
    assert len(folders) == 1
    folder = folders.pop()
    assert folder.parent == cache and sorted(p.name for p in cache.iterdir()) == [".0123456789abcdef.crashed.tmp", folder.name]
    assert (folder / "textstats_task" / "task1" / "runner.sh").stat().st_mode & 0o777 == 0o755
    assert (folder / "textstats_task" / "task1" / "repo" / "textstats" / "core.py").stat().st_mode & 0o777 == 0o644
    marker = folder / "textstats_task" / "marker"
    marker.write_text("kept")
    assert builtin_tasks_dir() == folder and marker.read_text() == "kept"  # a second load reuses the folder
    marker.unlink()
    assert len(load_tasks()) == 12 and all(t.folder.is_relative_to(folder) for t in load_tasks())


def test_tasks_pairs_and_splits_by_repository(tasks):
    assert len(tasks) >= 12
    pairs = [p for t in tasks for p in t.pairs()]
    assert len(pairs) >= 30
    splits = {t.split for t in tasks}
    assert splits == {"train", "validation", "test"}
    repos = {s: {t.name.split("/")[0] for t in tasks if t.split == s} for s in splits}
    assert not (repos["train"] & repos["test"]) and not (repos["train"] & repos["validation"]) and not (repos["validation"] & repos["test"])
    for t in tasks:
        assert len(t.features) >= 2 and t.runner.is_file()
        assert all(f.request.strip() and f.patch and f.tests_patch and f.visible_patch and f.naive_patch for f in t.features.values())
        assert t.naive_conflicts, f"{t.name} declares no pair whose naive patches conflict"


def test_base_commits_are_reproducible(tasks, tmp_path):
    hashes = {init_base(tasks[0].repo, tmp_path / f"copy{i}") for i in range(2)}
    assert len(hashes) == 1 and re.fullmatch(r"[0-9a-f]{40}", hashes.pop())


@pytest.mark.integration
def test_gold_pairs_merge_and_pass_empty_fail_and_naive_pairs_conflict_as_declared(tasks, scorer):
    task = next(t for t in tasks if t.name == "textstats/task1")
    for a, b in task.pairs():
        fa, fb = task.feature(a), task.feature(b)
        gold = scorer.score_pair(task, (a, b), (fa.patch, fb.patch))
        assert gold.merge == "clean" and gold.success and all(f.tests_run >= 1 for f in gold.features.values())
        empty = scorer.score_pair(task, (a, b), ("", ""))
        assert empty.merge == "clean" and not empty.success and not any(f.passed for f in empty.features.values())
        naive = scorer.score_pair(task, (a, b), (fa.naive_patch, fb.naive_patch))
        assert (naive.merge == "conflict") == ((a, b) in task.naive_conflicts)
        if naive.merge == "conflict":
            # CooperBench: the first patch alone is tested against both features, so the pair fails
            assert naive.conflict_files == ["textstats/core.py"] and naive.features[a].passed and not naive.features[b].passed
    # one gold patch alone: its own feature passes, the partner's does not
    one = scorer.score_pair(task, (1, 2), (task.feature(1).patch, ""))
    assert one.features[1].passed and not one.features[2].passed and not one.success


@pytest.mark.integration
def test_union_merge_is_only_an_explicit_setting(tasks):
    task = next(t for t in tasks if t.name == "textstats/task1")
    f1, f2 = task.feature(1), task.feature(2)
    union = Scorer(merge="union").score_pair(task, (1, 2), (f1.naive_patch, f2.naive_patch))
    assert union.merge == "clean" and union.success  # both appended functions kept
    with pytest.raises(ValueError, match="plain, union"):
        Scorer(merge="ours")


def test_test_files_are_filtered_out_of_graded_patches(tasks):
    task = tasks[0]
    patch = task.feature(1).patch + task.feature(1).tests_patch
    assert "tests/" in patch and "tests/" not in filter_test_files(patch)
    assert filter_test_files(patch) == task.feature(1).patch


# ---- the sandbox ------------------------------------------------------------------------------------------


def _handmade(root: Path, hidden_test: str, name: str = "loop") -> Path:
    """A task in CooperBench's layout: its upstream repository at a commit elsewhere, extra files, a pytest runner."""
    upstream = root / "upstream"
    (upstream / "pkg").mkdir(parents=True)
    (upstream / "pkg" / "__init__.py").write_text("")
    (upstream / "pkg" / "mod.py").write_text("def one():\n    return 1\n")
    subprocess.run(["git", "init", "-q"], cwd=upstream, check=True)
    subprocess.run(["git", "-c", "user.name=x", "-c", "user.email=x@x", "add", "-A"], cwd=upstream, check=True)
    subprocess.run(["git", "-c", "user.name=x", "-c", "user.email=x@x", "commit", "-qm", "upstream"], cwd=upstream, check=True)
    task = root / f"{name}_task" / "task7"
    (task / "resolution_patches").mkdir(parents=True)
    (task / "resolution_patches" / "x.patch").write_text("not read")
    (task / "runner.sh").write_text(
        textwrap.dedent("""\
        #!/bin/bash
        set -e
        [ -s "${2:-}" ] && git apply "$2"
        git apply "$1"
        python -m pytest -q -p no:cacheprovider tests
        """)
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "w"
        clone_source = Path(tmp) / "base"
        init_base(upstream, clone_source)
        clone(clone_source, work)

        def patch_of(changes: dict[str, str]) -> str:
            for p, text in changes.items():
                (work / p).parent.mkdir(parents=True, exist_ok=True)
                (work / p).write_text(text)
            subprocess.run(["git", "add", "-A"], cwd=work, check=True)
            out = subprocess.run(["git", "diff", "--cached"], cwd=work, check=True, capture_output=True, text=True).stdout
            subprocess.run(["git", "reset", "-q", "--hard"], cwd=work, check=True)
            return out

        features = {
            1: (
                {"pkg/mod.py": "def one():\n    return 1\n\n\ndef two():\n    return 2\n"},
                "from pkg.mod import two\n\ndef test_two():\n    assert two() == 2\n",
            ),
            2: ({"pkg/other.py": "def three():\n    return 3\n"}, hidden_test),
        }
        for n, (code, test) in features.items():
            (task / f"feature{n}").mkdir()
            (task / f"feature{n}" / "feature.md").write_text(f"feature {n}")
            (task / f"feature{n}" / "feature.patch").write_text(patch_of(code))
            (task / f"feature{n}" / "feature.filtered.patch").write_text("ignored")
            (task / f"feature{n}" / "tests.patch").write_text(patch_of({f"tests/test_f{n}.py": test}))
    return task


LOOPING = "from pkg.other import three\n\ndef test_three():\n    while True:\n        pass\n"


@pytest.mark.integration
def test_a_hidden_test_that_loops_forever_is_killed_at_the_limit_and_the_rest_is_scored(tmp_path):
    folder = _handmade(tmp_path, LOOPING)
    task = load_task(folder, repo=tmp_path / "upstream")
    started = time.perf_counter()
    score = Scorer(Limits(seconds=3)).score_pair(task, (1, 2), (task.feature(1).patch, task.feature(2).patch))
    assert time.perf_counter() - started < 30
    assert score.merge == "clean" and not score.success
    assert score.features[2].timed_out and not score.features[2].passed and score.features[2].exit_code is None
    assert score.features[1].passed and score.features[1].tests_run == 1  # pytest's "1 passed", after the looping one


@pytest.mark.integration
def test_sandbox_limits_memory_output_and_network(tmp_path):
    hog = run_sandboxed([sys.executable, "-c", "x = bytearray(600 * 1024 * 1024)"], tmp_path, Limits(memory_mb=256))
    assert hog.exit_code not in (0, None) and "MemoryError" in hog.output
    flood = run_sandboxed([sys.executable, "-c", "print('x' * 10_000_000)"], tmp_path, Limits(output_bytes=1000))
    assert len(flood.output) < 1200 and "output cut at 1000 bytes" in flood.output
    net = run_sandboxed([sys.executable, "-c", "import socket; socket.create_connection(('127.0.0.1', 9))"], tmp_path)
    assert net.exit_code != 0 and "OSError" in net.output and net.network in ("guard", "namespace+guard")
    env = run_sandboxed([sys.executable, "-c", "import os; print(sorted(os.environ))"], tmp_path)
    assert "OPENAI_API_KEY" not in env.output and "HOME" in env.output


@pytest.mark.integration
def test_patches_that_write_outside_the_working_copy_are_refused(tasks, scorer, tmp_path):
    task = tasks[0]
    evil = "--- a/../escape.py\n+++ b/../escape.py\n@@ -0,0 +1 @@\n+x = 1\n"
    with pytest.raises(PatchError, match=r"outside its working copy \(\.\./escape\.py\)"):
        scorer.score_pair(task, (1, 2), (evil, ""))
    git_dir = "diff --git a/.git/config b/.git/config\n--- a/.git/config\n+++ b/.git/config\n@@ -1 +1 @@\n-a\n+b\n"
    with pytest.raises(PatchError, match="outside"):
        scorer.score_solo(task, (1, 2), git_dir)
    env = Coop()
    t = env.tasks("train")[0]
    state = env.start(t)
    try:
        copy = state.copies[AGENT]
        (copy / "link").symlink_to(tmp_path)
        for name, args in [
            ("write_file", {"path": "../escape.py", "content": "x"}),
            ("write_file", {"path": "/tmp/escape.py", "content": "x"}),
            ("write_file", {"path": "link/escape.py", "content": "x"}),
            ("write_file", {"path": ".git/hooks/pre-commit", "content": "x"}),
            ("apply_patch", {"patch": evil}),
            ("read_file", {"path": "../../etc/passwd"}),
        ]:
            result = env.execute(t, state, AGENT, ToolCall(id="c", name=name, arguments=args))
            assert result.error and "outside" in result.content, (name, args, result.content)
        assert not (tmp_path / "escape.py").exists() and not (copy.parent / "escape.py").exists()
    finally:
        env.finish(t, state, _episode())


def _episode(status=EpisodeStatus.FAILED):
    from scope_marl.core.types import Episode

    return Episode(episode_id="e", task_id="t", group_id="g", simulator_id="s", status=status)


# ---- CooperBench's layout and the CLI ---------------------------------------------------------------------


@pytest.mark.integration
def test_scope_coop_score_reads_a_real_layout_task_with_its_upstream_repository(tmp_path):
    folder = _handmade(tmp_path, "from pkg.other import three\n\ndef test_three():\n    assert three() == 3\n", name="demo")
    task = load_task(folder, repo=tmp_path / "upstream")
    assert task.name == "demo/task7" and sorted(task.features) == [1, 2]  # resolution_patches/, feature.filtered.patch ignored
    a, b = folder / "feature1" / "feature.patch", folder / "feature2" / "feature.patch"
    runner = CliRunner()
    args = ["coop", "score", str(folder), "--repo", str(tmp_path / "upstream"), "--features", "1,2"]
    result = runner.invoke(app, [*args, "--patches", str(a), str(b)])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["merge"] == "clean" and out["conflict_files"] == [] and out["success"] is True
    assert out["features"]["1"]["passed"] and out["features"]["2"]["tests_run"] == 1
    empty = tmp_path / "empty.patch"
    empty.write_text("")
    out = json.loads(runner.invoke(app, [*args, "--patches", str(a), str(empty)]).stdout)
    assert out["features"]["1"]["passed"] and not out["features"]["2"]["passed"] and out["success"] is False
    # bad input: a clear error, no traceback
    missing = runner.invoke(app, ["coop", "score", str(folder), "--features", "1,2", "--patches", str(a), str(b)])
    assert missing.exit_code == 2 and "--repo PATH" in missing.output and "Traceback" not in missing.output
    with pytest.raises(TaskError, match="feature.md, feature.patch and tests.patch"):
        (folder / "feature2" / "tests.patch").unlink()
        load_task(folder, repo=tmp_path / "upstream")


@pytest.mark.integration
def test_scope_coop_score_on_a_built_in_task_reports_a_conflict(tasks):
    task = next(t for t in tasks if t.name == "units/task1")
    f = task.folder
    result = CliRunner().invoke(
        app,
        [
            "coop",
            "score",
            str(f),
            "--features",
            "1,2",
            "--patches",
            str(f / "feature1" / "naive.patch"),
            str(f / "feature2" / "naive.patch"),
        ],
    )
    out = json.loads(result.stdout)
    assert out["merge"] == "conflict" and out["conflict_files"] == ["units/core.py"] and out["success"] is False


# ---- the environment --------------------------------------------------------------------------------------


def _writer(env: Coop, task, feature: int, kind: str = "patch"):
    """A scripted seat that writes its feature's module as ``kind`` (gold or naive) would leave it,
    runs its visible tests, then says it is done."""
    t = env.task_of(task)
    patch = getattr(t.feature(feature), kind)
    module = re.search(r"\+\+\+ b/(\S+)", patch).group(1)
    with tempfile.TemporaryDirectory() as d:
        clone(env.bases.get(t)[0], Path(d) / "r")
        apply(Path(d) / "r", patch)
        content = (Path(d) / "r" / module).read_text()

    def reply(prompt):
        last = prompt[-1].content
        if "<tool_response>" not in last:
            return (
                f"I will add my function to {module}.<tool_call>"
                + json.dumps({"name": "write_file", "arguments": {"path": module, "content": content}})
                + "</tool_call>"
            )
        if "wrote" in last:
            return '<tool_call>{"name": "run_tests", "arguments": {}}</tool_call>'
        return f"My tests pass. {DONE}"

    return reply


def _play(env, task, kind_agent="patch", kind_user="patch"):
    sampling = SamplingParams(max_new_tokens=100_000)
    a, b = env.features(task)
    agent = Seat(model=ScriptedChatModel(_writer(env, task, a, kind_agent)), sampling=sampling)
    partner = FrozenSimulator(ScriptedChatModel(_writer(env, task, b, kind_user) if env.setting == "coop" else ["unused"]), sampling)
    return RolloutEngine(env, agent, partner, RolloutConfig(group_size=1, progress=False)).run([task])[0]


@pytest.mark.integration
def test_two_seats_writing_gold_code_succeed_and_naive_code_conflicts():
    env = Coop()
    task = next(t for t in env.tasks("train") if t.task_id == "textstats/task1:1,2")
    before = set(Path(tempfile.gettempdir()).glob("scope-coop-episode-*"))
    gold = _play(env, task)
    assert gold.status == EpisodeStatus.COMPLETED and gold.rewards == {AGENT: 1.0, USER: 1.0}
    coop = gold.metadata["coop"]
    assert coop["merge"] == "clean" and coop["success"] and gold.metadata["success"]
    assert set(gold.metadata["patches"]) == {AGENT, USER}
    assert "def char_frequency" in gold.metadata["patches"][AGENT] and "tests/" not in gold.metadata["patches"][AGENT]
    tools = [m for m in gold.messages if m.role == TOOL]
    assert len(tools) == 4 and any("PASSED" in m.content for m in tools)
    # the channel: the partner reads the agent's messages, never its tool calls and results
    partner_view = " ".join(m.content for m in role_view(gold.messages, USER, "") if m.role == "user")
    assert f"My tests pass. {DONE}" in partner_view and "wrote" not in partner_view and "I will add" not in partner_view
    naive = _play(env, task, "naive_patch", "naive_patch")
    assert naive.rewards == {AGENT: 0.0, USER: 0.0}
    assert naive.metadata["coop"]["merge"] == "conflict" and naive.metadata["coop"]["conflict_files"] == ["textstats/core.py"]
    partial = Coop(partial_credit=True)
    assert (
        _play(partial, task, "naive_patch", "naive_patch").rewards[AGENT] == 0.5
    )  # on the conflict, the first patch alone passes its feature
    assert set(Path(tempfile.gettempdir()).glob("scope-coop-episode-*")) == before, "working copies are removed at the end"


@pytest.mark.integration
def test_solo_setting_one_seat_both_features():
    env = Coop(setting="solo")
    task = env.tasks("validation")[0]
    assert env.tools(task, USER) == [] and len(env.tools(task, AGENT)) == 5
    prompt = env.system_prompt(task, AGENT)
    t = env.task_of(task)
    assert all(t.feature(n).request.strip() in prompt for n in env.features(task))
    episode = _play(env, task)  # the agent writes its first feature only, then speaks: the episode ends
    assert episode.status == EpisodeStatus.COMPLETED and all(m.role != USER for m in episode.messages)
    assert episode.rewards[AGENT] == 0.0 and episode.metadata["coop"]["features"][str(env.features(task)[0])]["passed"]


@pytest.mark.integration
def test_episodes_end_at_max_steps_and_are_scored():
    env = Coop(max_steps=4)
    task = env.tasks("test")[0]
    agent = Seat(model=ScriptedChatModel(['<tool_call>{"name": "list_files", "arguments": {}}</tool_call>']), sampling=SamplingParams())
    episode = RolloutEngine(
        env, agent, FrozenSimulator(ScriptedChatModel(["hi"]), SamplingParams()), RolloutConfig(group_size=1, progress=False)
    ).run([task])[0]
    assert episode.status == EpisodeStatus.COMPLETED and len(episode.messages) == 4
    assert episode.rewards == {AGENT: 0.0, USER: 0.0} and episode.metadata["coop"]["merge"] == "clean"
    listing = episode.messages[1].content
    assert "tests/test_base.py" in listing and ".git" not in listing


@pytest.mark.integration
def test_the_environment_pickles_and_plays_on_the_other_side():
    import pickle

    env = Coop()
    env.tasks("train")
    twin = pickle.loads(pickle.dumps(env))  # a Ray worker's copy makes its own base repositories
    task = twin.tasks("train")[0]
    state = twin.start(task)
    try:
        listing = twin.execute(task, state, USER, ToolCall(id="c", name="list_files", arguments={})).content
        assert "tests/test_base.py" in listing and not twin.execute(task, state, USER, ToolCall(id="d", name="run_tests")).error
    finally:
        twin.finish(task, state, _episode())
    assert not state.root.exists()


@pytest.mark.integration
def test_a_vs_partner_draws_a_whole_turn_and_a_drawn_call_runs_in_its_own_working_copy():
    from scope_marl.simulators.verbalized import VerbalizedSampling

    env = Coop(max_steps=6)
    task = env.tasks("train")[0]
    candidates = {
        "responses": [
            {"text": "write_file(path=NOTES.md, content=hello)", "probability": 0.98},
            {"text": "I will take the end of the module.", "probability": 0.01},
            {"text": f"Done. {DONE}", "probability": 0.01},
        ]
    }
    vs = VerbalizedSampling(ScriptedChatModel([json.dumps(candidates)]), k=3, method="prob", constrained=False, seed=0, simulator_id="vs")
    agent = Seat(model=ScriptedChatModel(["Which function will you add?"]), sampling=SamplingParams())
    (episode,) = RolloutEngine(env, agent, vs, RolloutConfig(group_size=1, progress=False, on_turn_limit="continue")).run([task])
    call = next(m for m in episode.messages if m.role == USER and m.tool_calls)
    assert call.tool_calls[0].name == "write_file" and call.tool_calls[0].arguments == {"path": "NOTES.md", "content": "hello"}
    assert "NOTES.md" in episode.metadata["patches"][USER] and "NOTES.md" not in episode.metadata["patches"][AGENT]
    assert episode.metadata["simulator_turns"][0]["candidates"][0]["call"] == "write_file"


def test_prompts_and_tools_of_each_seat():
    env = Coop()
    task = env.tasks("train")[0]
    t = env.task_of(task)
    a, b = env.features(task)
    agent, partner = env.system_prompt(task, AGENT), env.system_prompt(task, USER)
    assert t.feature(a).request.strip() in agent and t.feature(b).request.strip() not in agent
    assert t.feature(b).request.strip() in partner and "git merge" in partner and DONE in partner
    names = [s["function"]["name"] for s in env.tools(task, USER)]
    assert names == ["list_files", "read_file", "write_file", "apply_patch", "run_tests"]
    with pytest.raises(ValueError, match="train, validation, test|has"):
        env.tasks("dev")


# ---- configs and training ---------------------------------------------------------------------------------


def test_shipped_coop_configs_load():
    names = sorted(p.name for p in (ROOT / "configs").glob("train_coop_*.yaml"))
    assert names == ["train_coop_cotrain.yaml", "train_coop_frozen.yaml", "train_coop_population.yaml", "train_coop_vs.yaml"]
    for name in names:
        cfg = load_config(ROOT / "configs" / name, TrainConfig)
        assert cfg.env.name == "coop"


def test_the_coop_panel_plays_partners_no_shipped_config_trains_against():
    from scope_marl.evaluation.panel import load_panel

    panel = load_panel("coop-offline")
    assert panel.env.name == "coop" and panel.split == "test" and len(panel.simulators) >= 3
    for path in sorted((ROOT / "configs").glob("train_coop_*.yaml")):
        training = load_config(path, TrainConfig).simulator
        for s in panel.simulators:
            same = (s.simulator.mode, getattr(s.simulator, "prompt_prefix", ""), s.simulator.sampling)
            assert same != (training.mode, getattr(training, "prompt_prefix", ""), training.sampling), (path.name, s.id)


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["trainable", "population"])
def test_one_training_step_with_a_trainable_partner(tiny_model_dir, tmp_path, mode):
    from scope_marl.experiment import start

    pool = {"pool": {"every": 1, "max_size": 3}} if mode == "population" else {}
    cfg = TrainConfig.model_validate(
        pool
        | {
            "model": f"hf:{tiny_model_dir}",
            "env": {"name": "coop", "max_steps": 4},
            "agent_sampling": {"temperature": 1.0, "max_new_tokens": 8},
            "simulator": {"mode": "trainable", "model": f"hf:{tiny_model_dir}", "sampling": {"temperature": 1.0, "max_new_tokens": 8}},
            "trainable_roles": ["agent", "user"],
            "simulator_learner": {"lr": 0.01, "kl_coef": 0.01},
            "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
            "learner": {"lr": 0.01, "kl_coef": 0.01},
            "rollout": {"group_size": 2, "max_concurrent": 8, "on_turn_limit": "continue", "progress": False},
            "tasks_per_step": 2,
            "steps": 2 if mode == "population" else 1,
            "seed": 0,
            "threads": 1,
        }
    )
    trainer = start(cfg, tmp_path / "run")
    records = trainer.run(progress=False)
    assert [r["step"] for r in records] == ([1, 2] if mode == "population" else [1])
    episodes = [json.loads(line) for f in sorted((tmp_path / "run" / "rollouts").glob("*.jsonl")) for line in f.read_text().splitlines()]
    if mode == "population":  # step 2's groups face a pool member: the base snapshot or step 1's partner
        assert len(list((tmp_path / "run" / "pool" / "members").iterdir())) >= 2
        assert {e["simulator_id"] for e in episodes[4:]} == {f"trainable:{records[1]['pool_member']}"}
    assert len(episodes) == 4 * len(records) and all(e["metadata"]["coop"]["merge"] in ("clean", "conflict") for e in episodes)
    assert all(e["split"] == "train" for e in episodes)
    for role in ("agent", "user"):
        stats = records[0][f"train_{role}"]
        assert stats["episodes"] > 0 and stats["logprob_gap"] < 1e-4 and stats["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    streamed = [e for e in episodes if "user" in e["streams"]]
    assert streamed and all(e["streams"]["user"]["reward"] == e["rewards"]["user"] == e["rewards"]["agent"] for e in streamed)
