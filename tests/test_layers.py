"""The layers contract of pyproject.toml: it places every part of the package and names only real modules,
and two rules hold on the import graph. (lint-imports itself, which checks every contract, runs in make lint.)"""

from __future__ import annotations

import importlib.util
import pkgutil
import tomllib
from pathlib import Path

import grimp
import pytest

import scope_marl

ROOT = Path(__file__).parents[1]


def contracts() -> list[dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["importlinter"]["contracts"]


def contract(kind: str) -> dict:
    (found,) = [c for c in contracts() if c["type"] == kind]
    return found


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("scope_marl", cache_dir=None)  # no cache folder left in the repository


def test_every_top_level_part_of_the_package_has_a_layer():
    layered = {name.strip() for entry in contract("layers")["layers"] for name in entry.split("|")}
    present = {f"scope_marl.{m.name}" for m in pkgutil.iter_modules(scope_marl.__path__)}
    unplaced = sorted(present - layered)
    assert not unplaced, f"{', '.join(unplaced)} has no layer: add it to the layers contract in pyproject.toml ([tool.importlinter])"
    missing = sorted(layered - present)
    assert not missing, (
        f"the layers contract in pyproject.toml names {', '.join(missing)}, which is not a module of scope_marl: rename or remove it"
    )


def test_every_forbidden_module_exists():
    forbidden = contract("forbidden")
    for name in forbidden["source_modules"] + forbidden["forbidden_modules"]:
        assert importlib.util.find_spec(name) is not None, f"{name} in the forbidden contract of pyproject.toml does not exist (renamed?)"


def test_training_and_evaluation_never_import_each_other(graph):
    assert not graph.chain_exists(importer="scope_marl.training", imported="scope_marl.evaluation", as_packages=True)
    assert not graph.chain_exists(importer="scope_marl.evaluation", imported="scope_marl.training", as_packages=True)
    # The graph is real: both reach the run layout below them, and the CLI reaches both.
    for package in ("scope_marl.training", "scope_marl.evaluation"):
        assert graph.chain_exists(importer=package, imported="scope_marl.core.run_layout", as_packages=True)
        assert graph.chain_exists(importer="scope_marl.cli", imported=package, as_packages=True)


def test_environments_import_only_themselves_and_the_core_types(graph):
    envs = {"scope_marl.envs"} | graph.find_descendants("scope_marl.envs")
    assert "scope_marl.envs.say_the_word" in envs
    outside = {}
    for module in sorted(envs):
        for imported in graph.find_modules_directly_imported_by(module):
            if imported != "scope_marl.core.types" and imported not in envs:
                outside.setdefault(module, []).append(imported)
    assert not outside, f"environments import beyond scope_marl.core.types: {outside}"
    assert any("scope_marl.core.types" in graph.find_modules_directly_imported_by(m) for m in envs)
