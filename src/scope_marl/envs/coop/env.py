"""Cooperative coding (CooperBench-style): two seats implement two features of one repository.

- **Tasks**: every feature pair of every task (``tasks.py``); the agent implements the pair's first
  feature, the partner (the ``user`` role, played by any simulator mode) the second. Splits are by
  repository.
- **Seats**: each has its own git working copy of the base commit, with its own feature's visible
  tests added, and file tools through the tool-call protocol: ``list_files``, ``read_file``,
  ``write_file``, ``apply_patch`` and ``run_tests`` (its visible tests, sandboxed). A path that would
  leave the working copy is refused. What a seat says outside tool calls goes to the other seat:
  that is the message channel.
- **Ending**: once both seats have sent a message containing ``###DONE###``, or after ``max_steps``
  messages (tool calls and results count), either way COMPLETED and scored on what the working
  copies hold. The ``solo`` setting has one seat (the agent, both features, all their visible
  tests); its first message without tool calls ends the episode.
- **Scoring**: the two working copies' diffs go through :class:`scoring.Scorer`, CooperBench's
  procedure (plain merge by default). The reward is 1 when both features' hidden tests pass on the
  merged tree (``partial_credit``: the fraction that pass), for both seats alike: the partner's
  reward is cooperative. The episode records the patches, the merge status, conflict files and each
  feature's test result.

The outcome lives in the working copies, not in the messages, so this environment scores in
``finish`` (which sees the per-episode state) rather than in ``rewards``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scope_marl.core.types import TOOL, Episode, EpisodeStatus, Message, ToolCall
from scope_marl.envs.base import AGENT, USER, Environment, Task
from scope_marl.envs.coop.git import GitError, apply, clone, diff_from_head, git, inside, unsafe_paths
from scope_marl.envs.coop.sandbox import Limits, run_sandboxed
from scope_marl.envs.coop.scoring import BaseRepos, PatchError, Scorer
from scope_marl.envs.coop.tasks import CoopTask, load_tasks

DONE = "###DONE###"
SETTINGS = ("coop", "solo")


def _tool(name: str, description: str, **params: str) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": "string", "description": v} for k, v in params.items()},
                "required": list(params),
            },
        },
    }


TOOLS = [
    _tool("list_files", "List the files of your working copy."),
    _tool("read_file", "Read one file of your working copy.", path="path relative to the repository root"),
    _tool(
        "write_file",
        "Create or overwrite one file of your working copy.",
        path="path relative to the repository root",
        content="the whole new file content",
    ),
    _tool("apply_patch", "Apply a unified diff (git format) to your working copy.", patch="the diff"),
    _tool("run_tests", "Run the visible tests of your feature on your working copy."),
]

PROMPT = """You are a software engineer working on a small Python repository{partner}.

Your feature request:
{request}
Work in your own copy of the repository with the tools: read the code, write your change, run your
tests. {coordination}When your work is finished and your tests pass, send a message containing {done}."""

PARTNER = " together with a partner. Your partner implements a different feature in their own copy of the same repository"
COORDINATION = (
    "At the end your two changes are combined with git merge: if you both edit the same lines the merge fails "
    "and you both fail. Everything you write outside tool calls is sent to your partner: tell them which file and "
    "which place you will change, and agree on separate places. "
)


@dataclass
class Seats:
    """One episode's working copies (the per-episode state)."""

    root: Path
    copies: dict[str, Path]
    visible: dict[str, list[str]]  # role -> its visible test files


class Coop(Environment):
    name = "coop"

    def __init__(
        self,
        setting: str = "coop",
        tasks_dir: str | Path | None = None,
        max_steps: int = 40,
        tool_output_chars: int = 2000,
        partial_credit: bool = False,
        merge: str = "plain",
        limits: Limits = Limits(),
        runtime: str = "auto",
        network: str | None = None,
    ):
        if setting not in SETTINGS:
            raise ValueError(f"unknown coop setting {setting!r}; choose one of {', '.join(SETTINGS)}")
        self.setting = setting
        self.tasks_dir = str(tasks_dir) if tasks_dir is not None else None
        self.max_steps = max_steps
        self.tool_output_chars = tool_output_chars
        self.partial_credit = partial_credit
        self.bases = BaseRepos()
        self.scorer = Scorer(limits, merge, self.bases, runtime, network)
        self._tasks: dict[str, CoopTask] | None = None

    def __getstate__(self):
        return {**self.__dict__, "_tasks": None}

    # ---- tasks ------------------------------------------------------------------------------------
    def coop_tasks(self) -> dict[str, CoopTask]:
        if self._tasks is None:
            self._tasks = {t.name: t for t in load_tasks(self.tasks_dir)}
        return self._tasks

    def task_of(self, task: Task) -> CoopTask:
        return self.coop_tasks()[task.data["task"]]

    def features(self, task: Task) -> tuple[int, int]:
        a, b = task.data["features"]
        return a, b

    def tasks(self, split: str = "train") -> list[Task]:
        out = []
        for t in self.coop_tasks().values():
            if t.split != split:
                continue
            for a, b in t.pairs():
                out.append(Task(task_id=f"{t.name}:{a},{b}", split=split, data={"task": t.name, "features": [a, b]}))
        if not out:
            splits = sorted({t.split for t in self.coop_tasks().values()})
            raise ValueError(f"coop has no tasks in split {split!r}; it has {', '.join(splits)}")
        return out

    def owned(self, task: Task, role: str) -> list[int]:
        """The features ``role`` implements."""
        a, b = self.features(task)
        if self.setting == "solo":
            return [a, b] if role == AGENT else []
        return [a] if role == AGENT else [b]

    # ---- prompts and turns ------------------------------------------------------------------------
    def system_prompt(self, task: Task, role: str) -> str:
        t = self.task_of(task)
        request = "\n".join(t.feature(n).request.strip() + "\n" for n in self.owned(task, role))
        solo = self.setting == "solo"
        return PROMPT.format(partner="" if solo else PARTNER, request=request, coordination="" if solo else COORDINATION, done=DONE)

    def tools(self, task: Task, role: str) -> list[dict]:
        return TOOLS if self.owned(task, role) else []

    def is_done(self, task: Task, messages: Sequence[Message]) -> bool:
        if len(messages) >= self.max_steps:
            return True
        spoken = [m for m in messages if m.role != TOOL and m.tool_calls is None]
        if self.setting == "solo":
            return any(m.role == AGENT for m in spoken)
        return all(any(m.role == role and DONE in m.content for m in spoken) for role in (AGENT, USER))

    def rewards(self, task: Task, messages: Sequence[Message]) -> dict[str, float]:
        raise NotImplementedError("coop's outcome is in the working copies: the engine scores it through finish()")

    # ---- the working copies -----------------------------------------------------------------------
    def start(self, task: Task) -> Seats:
        t = self.task_of(task)
        base, _ = self.bases.get(t)
        root = Path(tempfile.mkdtemp(prefix="scope-coop-episode-"))
        copies, visible = {}, {}
        for role in (AGENT, USER):
            owned = self.owned(task, role)
            if not owned:
                continue
            copies[role] = root / role
            clone(base, copies[role])
            visible[role] = []
            for n in owned:
                patch = t.feature(n).visible_patch
                if patch:
                    apply(copies[role], patch, three_way=False)
                    visible[role] += _added_files(patch)
            # committed in the copy, so the seat's diff (against its HEAD) holds only its own work
            git(["add", "-A"], copies[role])
            git(["commit", "-q", "--allow-empty", "-m", "visible tests"], copies[role])
        return Seats(root, copies, visible)

    def execute(self, task: Task, state: Seats, role: str, call: ToolCall) -> Message:
        try:
            content = self._run_tool(state, role, call)
            error = False
        except (ValueError, OSError, GitError, KeyError) as err:
            content, error = f"Error: {err}", True
        return Message(role=TOOL, content=self._cap(content), tool_call_id=call.id, requestor=role, error=error)

    def _cap(self, text: str) -> str:
        limit = self.tool_output_chars
        return text if len(text) <= limit else text[:limit] + f"\n[... {len(text) - limit} more characters cut]"

    def _run_tool(self, state: Seats, role: str, call: ToolCall) -> str:
        root = state.copies[role]
        args = call.arguments

        def arg(name: str) -> str:
            if name not in args or not isinstance(args[name], str):
                raise ValueError(f"{call.name} needs a string argument {name!r}")
            return args[name]

        if call.name == "list_files":
            files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and ".git" not in p.relative_to(root).parts)
            return "\n".join(f for f in files if "__pycache__" not in f)
        if call.name == "read_file":
            path = inside(root, arg("path"))
            if not path.is_file():
                raise ValueError(f"no file {arg('path')!r}; list_files shows what exists")
            return path.read_text(errors="replace")
        if call.name == "write_file":
            path = inside(root, arg("path"))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(arg("content"))
            return f"wrote {arg('path')} ({len(arg('content'))} characters)"
        if call.name == "apply_patch":
            patch = arg("patch")
            bad = unsafe_paths(patch)
            if bad:
                raise ValueError(f"the patch names paths outside the working copy ({', '.join(bad)}); refused")
            apply(root, patch if patch.endswith("\n") else patch + "\n")
            return "patch applied"
        if call.name == "run_tests":
            return self._visible_tests(state, role)
        raise ValueError(f"unknown tool {call.name!r}; the tools are {', '.join(t['function']['name'] for t in TOOLS)}")

    def _visible_tests(self, state: Seats, role: str) -> str:
        files = state.visible.get(role) or []
        if not files:
            return "this task has no visible tests for your feature"
        with tempfile.TemporaryDirectory(prefix="scope-coop-visible-") as tmp:
            tree = Path(tmp) / "tree"
            shutil.copytree(state.copies[role], tree, ignore=shutil.ignore_patterns(".git", "__pycache__"))
            result = run_sandboxed(["python", "-m", "unittest", *files], tree, self.scorer.limits)
        verdict = "PASSED" if result.exit_code == 0 and result.tests_run >= 1 else "FAILED"
        return f"{verdict}\n{result.output.strip()}"

    # ---- the end ----------------------------------------------------------------------------------
    def finish(self, task: Task, state: Seats | None, episode: Episode) -> None:
        """Score the working copies (when the episode got that far) and remove them."""
        episode.metadata.update(self.episode_metadata(task, episode.messages))
        try:
            if state is None or episode.status == EpisodeStatus.FAILED:
                return
            t = self.task_of(task)
            patches = {role: diff_from_head(path) for role, path in state.copies.items()}
            episode.metadata["patches"] = patches
            a, b = self.features(task)
            try:
                if self.setting == "solo":
                    score = self.scorer.score_solo(t, (a, b), patches[AGENT])
                else:
                    score = self.scorer.score_pair(t, (a, b), (patches[AGENT], patches[USER]))
            except PatchError as err:  # a working copy whose diff git cannot replay: the pair fails
                episode.metadata["coop"] = {"error": str(err), "success": False}
                episode.metadata["success"] = False
                if episode.status == EpisodeStatus.COMPLETED:
                    episode.rewards = {AGENT: 0.0, USER: 0.0}
                return
            episode.metadata["coop"] = score.as_json()
            episode.metadata["success"] = score.success
            if episode.status == EpisodeStatus.COMPLETED:
                r = score.passed_fraction if self.partial_credit else float(score.success)
                episode.rewards = {AGENT: r, USER: r}
        finally:
            if state is not None:
                shutil.rmtree(state.root, ignore_errors=True)

    def episode_metadata(self, task: Task, messages: Sequence[Message]) -> dict[str, Any]:
        a, b = self.features(task)
        return {"task": task.data["task"], "features": [a, b], "setting": self.setting}

    def describe(self) -> dict[str, Any]:
        sizes: dict[str, int] = {}
        for t in self.coop_tasks().values():
            sizes[t.split] = sizes.get(t.split, 0) + len(t.pairs())
        return {
            "name": self.name,
            "setting": self.setting,
            "tasks_dir": self.tasks_dir or "built-in",
            "max_steps": self.max_steps,
            "partial_credit": self.partial_credit,
            "merge": self.scorer.merge,
            "splits": sizes,
        }


def _added_files(patch: str) -> list[str]:
    """Files a patch creates (its ``+++ b/...`` paths after ``--- /dev/null``)."""
    lines = patch.splitlines()
    return [lines[i + 1][6:] for i, line in enumerate(lines[:-1]) if line == "--- /dev/null" and lines[i + 1].startswith("+++ b/")]
