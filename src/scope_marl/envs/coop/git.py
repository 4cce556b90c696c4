"""The git operations of the coop environment: a reproducible base commit, working copies, diffs,
patches applied as CooperBench applies them, and the checks that keep a patch inside its tree."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

# One fixed identity and date: the base commit of a tree has the same hash on every machine.
IDENTITY = {
    "GIT_AUTHOR_NAME": "scope-marl",
    "GIT_AUTHOR_EMAIL": "coop@scope-marl.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "scope-marl",
    "GIT_COMMITTER_EMAIL": "coop@scope-marl.invalid",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
}
CONFIG = ["-c", "core.autocrlf=false", "-c", "core.fileMode=true", "-c", "init.defaultBranch=base", "-c", "commit.gpgSign=false"]
IGNORED = "__pycache__/\n*.pyc\n.pytest_cache/\n"  # what running tests leaves behind is never part of a patch


class GitError(RuntimeError):
    """A git command failed; the message carries git's own words."""


def git(args: list[str], cwd: Path, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1", "LANG": "C", **IDENTITY}
    proc = subprocess.run(["git", *CONFIG, *args], cwd=cwd, env=env, input=stdin, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed: {(proc.stderr or proc.stdout).strip()}")
    return proc


def archive(repo: Path, commit: str) -> bytes:
    """``commit``'s files as a tar archive (bytes: the text helper above would mangle them)."""
    return subprocess.run(["git", "archive", "--format=tar", commit], cwd=repo, capture_output=True, check=True).stdout


def init_base(tree: Path, dest: Path) -> str:
    """``tree``'s files (its own ``.git`` left out) as a new repository at ``dest`` with one commit;
    returns the commit's hash (the same for the same files everywhere)."""
    shutil.copytree(tree, dest, ignore=shutil.ignore_patterns(".git"), symlinks=True)
    git(["init", "-q"], dest)
    (dest / ".git" / "info").mkdir(parents=True, exist_ok=True)
    (dest / ".git" / "info" / "exclude").write_text(IGNORED)
    git(["add", "-A"], dest)
    git(["commit", "-q", "--allow-empty", "-m", "base"], dest)
    return head(dest)


def head(repo: Path) -> str:
    return git(["rev-parse", "HEAD"], repo).stdout.strip()


def clone(base: Path, dest: Path) -> None:
    """A working copy of ``base`` at its commit, with the same ignore rules."""
    git(["clone", "-q", str(base), str(dest)], base.parent)
    (dest / ".git" / "info").mkdir(parents=True, exist_ok=True)
    (dest / ".git" / "info" / "exclude").write_text(IGNORED)


def diff_from_head(repo: Path) -> str:
    """Everything the working copy changed since its commit (new files included), as a git patch."""
    git(["add", "-A"], repo)
    return git(["diff", "--cached", "--binary", "--no-color", "--no-ext-diff", "HEAD"], repo).stdout


def apply(repo: Path, patch: str, three_way: bool = True) -> str:
    """Apply ``patch`` to ``repo``'s working tree as CooperBench does: ``git apply``, retried with
    ``--3way``. Returns ``applied`` or ``skipped`` (empty patch); raises GitError with git's words."""
    if not patch.strip():
        return "skipped"
    first = git(["apply", "--whitespace=nowarn", "-"], repo, check=False, stdin=patch)
    if first.returncode == 0:
        return "applied"
    if three_way:
        second = git(["apply", "--3way", "--whitespace=nowarn", "-"], repo, check=False, stdin=patch)
        if second.returncode == 0:
            return "applied"
    raise GitError(f"the patch does not apply: {(first.stderr or first.stdout).strip()}")


_PATH_LINE = re.compile(r"^(?:--- |\+\+\+ |rename (?:from|to) |copy (?:from|to) )(.+)$", re.MULTILINE)
_GIT_HEADER = re.compile(r"^diff --git (\S+) (\S+)$", re.MULTILINE)


def patch_paths(patch: str) -> list[str]:
    """Every path a patch names (headers, renames, copies), without a/ b/ prefixes."""
    paths = []
    for m in _PATH_LINE.finditer(patch):
        value = m.group(1).split("\t")[0].strip()
        if value != "/dev/null":
            paths.append(value)
    for m in _GIT_HEADER.finditer(patch):
        paths.extend(m.groups())
    out = []
    for p in paths:
        p = p.strip('"')
        out.append(p[2:] if p[:2] in ("a/", "b/") else p)
    return out


def outside_tree(path: str) -> bool:
    """Whether a relative path would leave its tree or touch git's own files."""
    parts = Path(path).parts
    return Path(path).is_absolute() or ".." in parts or not parts or parts[0] == ".git"


def unsafe_paths(patch: str) -> list[str]:
    return sorted({p for p in patch_paths(patch) if outside_tree(p)})


def inside(root: Path, path: str) -> Path:
    """``root / path`` when it stays inside ``root`` (symbolic links resolved); ValueError otherwise."""
    if outside_tree(path):
        raise ValueError(f"{path!r} is outside the working copy: use a relative path inside the repository (not .git)")
    target = (root / path).resolve()
    if target != root.resolve() and root.resolve() not in target.parents:
        raise ValueError(f"{path!r} resolves outside the working copy")
    return target


# CooperBench leaves test files out of the graded patch: an agent's own test file would collide with
# the hidden tests.patch and make `git apply` reject the whole patch.
_TEST_DIR = re.compile(r"(^|/)(tests?|__tests__|spec|testdata)/")
_TEST_FILE = re.compile(r"(^|/)(test_[^/]+|[^/]+_test\.[A-Za-z0-9]+|conftest\.py)$")


def is_test_file(path: str) -> bool:
    return bool(_TEST_DIR.search(path) or _TEST_FILE.search(path))


def filter_test_files(patch: str) -> str:
    """The patch without the file sections that touch test files."""
    sections = re.split(r"(?m)^(?=diff --git )", patch)
    kept = []
    for section in sections:
        m = _GIT_HEADER.match(section)
        if m and any(is_test_file(p[2:] if p[:2] in ("a/", "b/") else p) for p in m.groups()):
            continue
        kept.append(section)
    return "".join(kept)
