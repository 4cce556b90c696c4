"""Build the cooperative-coding tasks from their source in data/coop/, in CooperBench's layout, and
pack them into the archive the package ships (src/scope_marl/envs/coop/tasks.tar.gz).

The source, per repository ``data/coop/{repo}/`` (data/coop/README.md says more):

- ``task.json``: the repository's split and, per feature, the module its gold code goes into and the
  existing function it follows there (``anchor``);
- ``repo/``: the base repository as plain files;
- ``feature{N}/feature.md`` (the request), ``gold.py`` (the new code), ``test_*.py`` (hidden tests)
  and ``test_*_visible.py`` (tests the seat may run), each test file added as ``tests/<its name>``.

The tasks built, per repository ``{repo}_task/task1/``:

- ``repo/``: the base repository, copied (no ``.git``: the loader makes one commit with a fixed
  author and date, so every hash is reproducible);
- ``runner.sh``: CooperBench's runner contract, ``runner.sh TESTS_PATCH [FEATURE_PATCH]`` run inside
  the tree: it applies both and runs the tests the tests patch adds (stdlib unittest);
- ``feature{N}/feature.md`` (copied; given to a seat verbatim), ``feature.patch`` (gold: ``gold.py``
  inserted after the anchor), ``tests.patch`` (the hidden tests), ``visible.patch`` (the visible
  tests) and ``naive.patch`` (the same code appended at the end of the module, as written without
  regard to the partner);
- ``coop.json``: the repository's split and the feature pairs whose naive patches conflict under a
  plain ``git merge`` (those that edit the same module).

Patches are made by git itself, so they are exactly what ``git apply`` reads. The archive is the same
bytes for the same source on every run (entries sorted, time 0, owner root, modes 0644 and 0755 for
folders and runner.sh, gzip without name or time); ``--check`` compares its contents with the shipped
archive, and so does tests/test_coop.py.

Run: python scripts/generate_coop_tasks.py            # rebuild src/scope_marl/envs/coop/tasks.tar.gz
     python scripts/generate_coop_tasks.py --check    # exit 1 when the shipped archive is not what data/coop builds
     python scripts/generate_coop_tasks.py --out DIR  # the tasks as a folder too, to read or diff
"""

from __future__ import annotations

import argparse
import gzip
import io
import itertools
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "data" / "coop"
ARCHIVE = ROOT / "src" / "scope_marl" / "envs" / "coop" / "tasks.tar.gz"
JUNK = {"__pycache__", ".pytest_cache"}  # what running a repository's tests in data/coop leaves behind

RUNNER = """\
#!/usr/bin/env bash
# CooperBench's runner contract: runner.sh TESTS_PATCH [FEATURE_PATCH], run inside the repository tree.
# Applies the feature patch (when given and not empty) and the hidden tests, then runs the test files
# the tests patch adds with the standard library's unittest (it prints "Ran N tests").
set -euo pipefail
tests_patch="$1"
feature_patch="${2:-}"
if [ -n "$feature_patch" ] && [ -s "$feature_patch" ]; then
    git apply "$feature_patch"
fi
git apply "$tests_patch"
mapfile -t files < <(git apply --numstat "$tests_patch" | cut -f3)
exec python -m unittest -v "${files[@]}"
"""

GIT = ["git", "-c", "user.name=coop-generator", "-c", "user.email=generator@scope-marl.invalid", "-c", "core.autocrlf=false"]


class SourceError(ValueError):
    """data/coop/{repo}/ is not laid out as data/coop/README.md says."""


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", newline="\n")


def tree_files(root: Path) -> list[str]:
    """The files under ``root`` as sorted relative POSIX paths, leaving out what running tests leaves."""
    out = []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if path.is_file() and not JUNK & set(rel.parts) and path.suffix != ".pyc":
            out.append(rel.as_posix())
    return sorted(out)


def insert_after(source: str, anchor: str, code: str) -> str:
    """``code`` as a new top-level function right after function ``anchor``."""
    lines = source.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(f"def {anchor}(")), None)
    if start is None:
        raise SourceError(f"anchor {anchor!r}: no top-level `def {anchor}(` in the module")
    end = next((i for i in range(start + 1, len(lines)) if lines[i] and not lines[i][0].isspace()), len(lines))
    while end > start and not lines[end - 1].strip():
        end -= 1
    new = lines[:end] + ["", "", *code.rstrip("\n").splitlines()] + lines[end:]
    return "\n".join(new) + "\n"


def append(source: str, code: str) -> str:
    return source.rstrip("\n") + "\n\n\n" + code


def diff(repo: Path, changes: dict[str, str]) -> str:
    """The git patch taking the committed tree to one with ``changes`` (path -> new text)."""
    for path, text in changes.items():
        write(repo / path, text)
    subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
    out = subprocess.run(
        [*GIT, "diff", "--cached", "--no-color", "--no-ext-diff"], cwd=repo, check=True, capture_output=True, text=True
    ).stdout
    subprocess.run([*GIT, "reset", "-q", "--hard"], cwd=repo, check=True)
    subprocess.run([*GIT, "clean", "-qfd"], cwd=repo, check=True)
    return out


def features_of(source: Path) -> list[tuple[Path, dict]]:
    """``(feature folder, its task.json entry)`` in feature order, checked against the folders there."""
    meta = json.loads(read(source / "task.json"))
    folders = sorted((p for p in source.glob("feature*") if p.is_dir()), key=lambda p: (len(p.name), p.name))
    names = [p.name for p in folders]
    if names != [f"feature{n}" for n in range(1, len(names) + 1)] or sorted(names) != sorted(meta["features"]):
        raise SourceError(
            f"{source}: feature folders {names} must be feature1, feature2, ... and match task.json's {sorted(meta['features'])}"
        )
    out = []
    for folder in folders:
        tests = sorted(p.name for p in folder.glob("test_*.py"))
        missing = [n for n in ("feature.md", "gold.py") if not (folder / n).is_file()]
        if missing or not any(t.endswith("_visible.py") for t in tests) or all(t.endswith("_visible.py") for t in tests):
            raise SourceError(f"{folder}: needs feature.md, gold.py, a hidden test_*.py and a visible test_*_visible.py")
        out.append((folder, meta["features"][folder.name]))
    return out


def write_task(source: Path, out: Path) -> dict:
    """Build ``data/coop/{repo}/`` into ``out/{repo}_task/task1/``; returns its coop.json."""
    meta = json.loads(read(source / "task.json"))
    task = out / f"{source.name}_task" / "task1"
    for rel in tree_files(source / "repo"):
        write(task / "repo" / rel, read(source / "repo" / rel))
    write(task / "runner.sh", RUNNER)
    features = features_of(source)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        shutil.copytree(task / "repo", repo, dirs_exist_ok=True)
        subprocess.run([*GIT, "init", "-q"], cwd=repo, check=True)
        subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
        subprocess.run([*GIT, "commit", "-q", "-m", "base"], cwd=repo, check=True)
        for folder, where in features:
            target = task / folder.name
            module, code = where["module"], read(folder / "gold.py")
            base = read(source / "repo" / module)
            tests = sorted(folder.glob("test_*.py"))
            write(target / "feature.md", read(folder / "feature.md"))
            patches = {
                "feature.patch": {module: insert_after(base, where["anchor"], code)},
                "naive.patch": {module: append(base, code)},
                "tests.patch": {f"tests/{t.name}": read(t) for t in tests if not t.name.endswith("_visible.py")},
                "visible.patch": {f"tests/{t.name}": read(t) for t in tests if t.name.endswith("_visible.py")},
            }
            for name, changes in patches.items():
                write(target / name, diff(repo, changes))
    modules = {n: where["module"] for n, (_, where) in enumerate(features, 1)}
    conflicts = [[a, b] for a, b in itertools.combinations(sorted(modules), 2) if modules[a] == modules[b]]
    coop = {"split": meta["split"], "naive_conflicts": conflicts, "generator": "scripts/generate_coop_tasks.py"}
    write(task / "coop.json", json.dumps(coop, indent=2) + "\n")
    return coop


def repositories(source: Path = SOURCE) -> list[Path]:
    return sorted(p for p in source.iterdir() if p.is_dir() and (p / "task.json").is_file())


def generate(out: Path, source: Path = SOURCE) -> list[dict]:
    """Every repository of ``source`` built into the folder ``out`` (replaced); their task.json."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for repo in repositories(source):
        write_task(repo, out)
    return [json.loads(read(repo / "task.json")) for repo in repositories(source)]


def tar_bytes(tree: Path) -> bytes:
    """``tree`` as an uncompressed tar whose bytes depend on the file names and contents alone."""
    paths = {Path(rel) for rel in tree_files(tree)}
    paths |= {parent for p in paths for parent in p.parents if parent != Path(".")}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for rel in sorted(paths, key=lambda p: p.parts):
            info = tarfile.TarInfo(rel.as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if (tree / rel).is_dir():
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                data = (tree / rel).read_bytes()
                info.size, info.mode = len(data), 0o755 if rel.name == "runner.sh" else 0o644
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def gzip_bytes(data: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        gz.write(data)
    return buf.getvalue()


def members(tar: bytes) -> dict[str, tuple[int, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        return {m.name: (m.mode, t.extractfile(m).read() if m.isfile() else b"") for m in t.getmembers()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, default=SOURCE, help="the tasks' source (default: data/coop)")
    parser.add_argument("--archive", type=Path, default=ARCHIVE, help="the archive to write or --check (default: the package's)")
    parser.add_argument("--out", type=Path, default=None, help="also write the built tasks as a folder here (replaced)")
    parser.add_argument("--check", action="store_true", help="write nothing but --out; exit 1 when --archive differs from the build")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        built = Path(args.out) if args.out is not None else Path(tmp) / "tasks"
        metas = generate(built, args.source)
        tar = tar_bytes(built)
    pairs = sum(len(m["features"]) * (len(m["features"]) - 1) // 2 for m in metas)
    if args.check:
        shipped = gzip.decompress(args.archive.read_bytes()) if args.archive.is_file() else b""
        if shipped != tar:
            old, new = members(shipped) if shipped else {}, members(tar)
            changed = sorted(n for n in old.keys() | new.keys() if old.get(n) != new.get(n))
            print(f"{args.archive} differs from what {args.source} builds in {len(changed)} entries: {', '.join(changed[:20])}")
            print("rebuild it: python scripts/generate_coop_tasks.py")
            sys.exit(1)
        print(f"{args.archive} is what {args.source} builds ({len(metas)} tasks)")
        return
    args.archive.parent.mkdir(parents=True, exist_ok=True)
    fd, part = tempfile.mkstemp(prefix=f".{args.archive.name}.", dir=args.archive.parent)
    with os.fdopen(fd, "wb") as handle:
        handle.write(gzip_bytes(tar))
    os.chmod(part, 0o644)
    os.replace(part, args.archive)
    where = f" and {args.out}" if args.out is not None else ""
    print(f"wrote {len(metas)} tasks, {pairs} feature pairs to {args.archive}{where}")


if __name__ == "__main__":
    main()
