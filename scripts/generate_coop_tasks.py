"""Write the cooperative-coding tasks (scripts/coop_specs.py) in CooperBench's layout.

For each repository: ``{name}_task/task1/`` holding

- ``repo/``: the upstream tree as plain files (no ``.git``: the loader makes one commit with a fixed
  author and date, so every hash is reproducible);
- ``runner.sh``: CooperBench's runner contract, ``runner.sh TESTS_PATCH [FEATURE_PATCH]`` run inside
  the tree: it applies both and runs the tests the tests patch adds (stdlib unittest);
- ``feature{N}/feature.md`` (the request, given to a seat verbatim), ``feature.patch`` (gold),
  ``tests.patch`` (hidden tests), ``visible.patch`` (tests the seat may run) and ``naive.patch``
  (the same code appended at the end of the module, written without regard to the partner);
- ``coop.json``: the repository's split and the feature pairs whose naive patches conflict under a
  plain ``git merge`` (features 1 and 2 edit the same module).

Patches are made by git itself, so they are exactly what ``git apply`` reads. The output is the same
bytes on every run; tests/test_coop.py regenerates into a temporary folder and compares.

Run: python scripts/generate_coop_tasks.py [--out DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coop_specs import REPOS

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "src" / "scope_marl" / "envs" / "coop" / "data"

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


def block(text: str) -> str:
    return textwrap.dedent(text).strip("\n") + "\n"


def test_file(imports: str, cls: str, asserts: list[str]) -> str:
    methods = "\n".join(f"    def test_{i}(self):\n        {a}\n" for i, a in enumerate(asserts, 1))
    return (
        f'import unittest\n\n{imports}\n\n\nclass {cls}(unittest.TestCase):\n{methods}\n\nif __name__ == "__main__":\n    unittest.main()\n'
    )


def camel(slug: str) -> str:
    return "".join(p.capitalize() for p in slug.split("_"))


def insert_after(source: str, anchor: str, code: str) -> str:
    """``code`` as a new top-level function right after function ``anchor``."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"def {anchor}("))
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
        target = repo / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
    out = subprocess.run(
        [*GIT, "diff", "--cached", "--no-color", "--no-ext-diff"], cwd=repo, check=True, capture_output=True, text=True
    ).stdout
    subprocess.run([*GIT, "reset", "-q", "--hard"], cwd=repo, check=True)
    subprocess.run([*GIT, "clean", "-qfd"], cwd=repo, check=True)
    return out


def base_files(spec: dict) -> dict[str, str]:
    package = spec["name"]
    files = {path: block(text) for path, text in spec["files"].items()}
    files[f"{package}/__init__.py"] = f'"""{package}: a small library (a cooperative-coding task of SCOPE-MARL)."""\n'
    files["tests/__init__.py"] = ""
    imports, check = spec["base_test"]
    files["tests/test_base.py"] = test_file(imports, "TestBase", [check])
    files["README.md"] = f"# {package}\n\nA small Python library. Run its tests with `python -m unittest discover -s tests -t .`.\n"
    return files


def write_task(spec: dict, out: Path) -> dict:
    task = out / f"{spec['name']}_task" / "task1"
    files = base_files(spec)
    for path, text in files.items():
        (task / "repo" / path).parent.mkdir(parents=True, exist_ok=True)
        (task / "repo" / path).write_text(text)
    (task / "runner.sh").write_text(RUNNER)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        shutil.copytree(task / "repo", repo, dirs_exist_ok=True)
        subprocess.run([*GIT, "init", "-q"], cwd=repo, check=True)
        subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
        subprocess.run([*GIT, "commit", "-q", "-m", "base"], cwd=repo, check=True)
        for n, feature in enumerate(spec["features"], 1):
            folder = task / f"feature{n}"
            folder.mkdir(parents=True, exist_ok=True)
            code, module = block(feature["code"]), feature["module"]
            cls = f"Test{camel(feature['slug'])}"
            (folder / "feature.md").write_text(f"# {feature['slug']}\n\n{feature['md']}\n")
            patches = {
                "feature.patch": {module: insert_after(files[module], feature["anchor"], code)},
                "naive.patch": {module: append(files[module], code)},
                "tests.patch": {f"tests/test_{feature['slug']}.py": test_file(feature["imports"], cls, feature["hidden"])},
                "visible.patch": {
                    f"tests/test_{feature['slug']}_visible.py": test_file(feature["imports"], cls + "Visible", feature["visible"])
                },
            }
            for name, changes in patches.items():
                (folder / name).write_text(diff(repo, changes))
    modules = {n: f["module"] for n, f in enumerate(spec["features"], 1)}
    conflicts = [[a, b] for a, b in itertools.combinations(sorted(modules), 2) if modules[a] == modules[b]]
    meta = {"split": spec["split"], "naive_conflicts": conflicts, "generator": "scripts/generate_coop_tasks.py"}
    (task / "coop.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def generate(out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for spec in REPOS:
        write_task(spec, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    generate(args.out)
    tasks = len(REPOS)
    pairs = sum(len(s["features"]) * (len(s["features"]) - 1) // 2 for s in REPOS)
    print(f"wrote {tasks} tasks, {pairs} feature pairs to {args.out}")


if __name__ == "__main__":
    main()
