"""Registries: environments and simulator modes are built by name, every loadable section has a
builder, heavy environments stay unimported until built, and unknown names list the known ones."""

from __future__ import annotations

import subprocess
import sys
from typing import Literal

import pytest

from scope_marl.assembly import ENVIRONMENTS, SIMULATOR_MODES, ModelCache, build_env, build_simulator, register_env
from scope_marl.config import ENV_CONFIGS, SIMULATOR_CONFIGS, FrozenSimulatorConfig, SayTheWordConfig, Section
from scope_marl.core.registry import Registry, UnknownName
from scope_marl.envs import SayTheWord
from scope_marl.simulators import FrozenSimulator


def test_every_env_section_has_exactly_one_builder_and_every_builder_a_section():
    assert ENVIRONMENTS.names() == sorted(ENV_CONFIGS) == ["coop", "p4g", "say_the_word", "tau2"]
    for name, schema in ENV_CONFIGS.items():
        assert ENVIRONMENTS.get(name).config is schema


def test_every_simulator_mode_has_exactly_one_builder_and_every_builder_a_section():
    assert SIMULATOR_MODES.names() == sorted(SIMULATOR_CONFIGS) == ["frozen", "persona_guided", "pool", "rotation", "trainable", "vs"]
    for mode, schema in SIMULATOR_CONFIGS.items():
        assert SIMULATOR_MODES.get(mode).config is schema


@pytest.mark.integration
def test_heavy_environments_are_imported_only_when_built():
    code = (
        "import sys, scope_marl.assembly, scope_marl.config;"
        "heavy = [m for m in sys.modules if m.startswith(('scope_marl.envs.tau2', 'scope_marl.envs.coop', 'scope_marl.envs.p4g', 'tau2'))];"
        "assert not heavy, heavy"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_build_env_and_build_simulator_look_the_builder_up_by_name():
    env = build_env(SayTheWordConfig(num_tasks=3))
    assert isinstance(env, SayTheWord) and len(env.tasks("train")) + len(env.tasks("validation")) + len(env.tasks("test")) >= 1
    simulator = build_simulator(FrozenSimulatorConfig(id="f", model="scripted:hi"), ModelCache())
    assert isinstance(simulator, FrozenSimulator) and simulator.simulator_id == "f"
    unknown = SayTheWordConfig.model_construct(name="nope")
    with pytest.raises(UnknownName, match=r"unknown environment 'nope'; known: coop, p4g, say_the_word, tau2; add one with @register_env"):
        build_env(unknown)
    with pytest.raises(ValueError, match=r"unknown simulator mode 'nope'; known: frozen, persona_guided, pool, rotation, trainable, vs"):
        build_simulator(FrozenSimulatorConfig.model_construct(mode="nope"), ModelCache())


def test_a_new_environment_is_one_registration():
    class EchoConfig(Section):
        name: Literal["echo_test"] = "echo_test"
        num_tasks: int = 2

    @register_env(EchoConfig)
    def build_echo(cfg: EchoConfig, models: ModelCache | None = None):
        return SayTheWord(num_tasks=cfg.num_tasks)

    try:
        assert "echo_test" in ENVIRONMENTS and ENVIRONMENTS.get("echo_test").build is build_echo
        assert isinstance(build_env(EchoConfig()), SayTheWord)
        with pytest.raises(ValueError, match="registered twice"):
            register_env(EchoConfig)(lambda cfg, models=None: None)
    finally:
        ENVIRONMENTS._entries.pop("echo_test", None)


def test_a_section_without_a_literal_tag_cannot_be_registered():
    class Untagged(Section):
        name: str = "free"

    with pytest.raises(TypeError, match="needs a `name: Literal"):
        register_env(Untagged)


def test_registry_basics():
    table: Registry[int] = Registry("widget", "@register_widget")
    table.register("b")(2)
    table.add("a", 1)
    table.add("a", 1)  # the same value again is harmless
    assert table.names() == ["a", "b"] and list(table) == ["a", "b"] and len(table) == 2 and "a" in table and 3 not in table
    with pytest.raises(UnknownName, match=r"unknown widget 'c'; known: a, b; add one with @register_widget"):
        table.get("c")
    with pytest.raises(ValueError, match="registered twice"):
        table.add("a", 5)
