"""Seed derivation (core.seeds.derive_seed): every call site gets the seed of the formula it replaced,
and the rollout engine's group counter carries its seeds across a resume.

(Formerly tests/test_core.py, with the atomic files, now tests/test_atomic_files.py, and the run layout,
now tests/test_run_layout.py.)"""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from scope_marl.backends.scripted import ScriptedChatModel
from scope_marl.backends.seat import Seat
from scope_marl.config import RolloutConfig
from scope_marl.core.seeds import derive_seed
from scope_marl.core.types import Message, SamplingParams
from scope_marl.envs import SayTheWord
from scope_marl.evaluation.evaluate import simulator_seed
from scope_marl.evaluation.gamma import sample_plain
from scope_marl.rollout import RolloutEngine
from scope_marl.simulators import FrozenSimulator, Rotation
from scope_marl.simulators.base import SimulatorTurn
from scope_marl.simulators.pool import SimulatorPool
from scope_marl.simulators.population import PopulationSimulator
from scope_marl.simulators.verbalized import VerbalizedSampling

BASES = [0, 1, 7, 3000, 10**9, 2**40]
KEYS = [0, 1, 2, 17, 999, 10**6, 2**31 + 5]
M = 1_000_003  # the multiplier of every old formula, written out here on purpose


# ---- derive_seed against the nine formulas it replaced ------------------------------------------


class SeedRecorder(ScriptedChatModel):
    """A scripted model that notes the seeds of every generate call: each row's (per-episode seeds, with
    the row's turn index) or, for callers that seed a whole call, ``sampling.seed``."""

    def __init__(self, replies, seeds: list, name: str = "scripted"):
        super().__init__(replies, name=name)
        self.seeds = seeds

    def generate(self, prompts, sampling, adapters=None, seeds=None):
        if seeds is None:
            self.seeds.append(sampling.seed)
        else:  # turn index = messages so far (the system prompt excluded)
            self.seeds.extend(zip(seeds, [len(p) - 1 for p in prompts]))
        return super().generate(prompts, sampling, adapters, seeds)


def test_derive_seed_rules():
    for base in BASES:
        assert derive_seed(base) == base
        assert derive_seed(base, bits=31) == base % 2**31
        for k1 in KEYS[:4]:
            for k2 in KEYS:
                assert derive_seed(base, k1, k2) == (base * M + k1) * M + k2
                assert 0 <= derive_seed(base, k1, k2, bits=31) < 2**31
    assert derive_seed(5, "abc") == 5 * M + zlib.crc32(b"abc")
    assert derive_seed(5, "abc") != derive_seed(5, "abd")
    # Unbounded without bits: large bases keep every digit (random.Random takes it as it is).
    assert derive_seed(2**40, 3) == 2**40 * M + 3 > 2**31


@pytest.mark.parametrize("base", BASES)
def test_rollout_engine_seeds_each_turn_by_group_rollout_and_turn(base):
    """rollout/engine.py: every turn's seed is ``derive_seed(config.seed, group, rollout, turn, bits=31)``
    (per-episode seeds), driven through a real engine: one seed per row, never per batch."""
    seeds: list = []
    model = SeedRecorder(["Please say it."], seeds)
    simulator = FrozenSimulator(SeedRecorder(["No."], seeds), simulator_id="frozen")
    engine = RolloutEngine(
        SayTheWord(num_tasks=2, max_exchanges=2), Seat(model=model), simulator, RolloutConfig(progress=False, group_size=2, seed=base)
    )
    episodes = engine.run(engine.env.tasks())
    expected = set()
    for e in episodes:
        group, rollout = (int(x) for x in e.episode_id.split("#")[1].split("/"))
        expected |= {(derive_seed(base, group, rollout, turn, bits=31), turn) for turn in range(len(e.messages))}
    assert len(seeds) == sum(len(e.messages) for e in episodes) == len(expected) and set(seeds) == expected


@pytest.mark.parametrize("base", [*BASES, None])
def test_verbalized_sampling_seeds_match_the_old_formula(base):
    """simulators/verbalized.py ``_seeded``: ``(base * 1_000_003 + calls_made) % 2**31``, base None counting as 0."""
    vs = VerbalizedSampling(ScriptedChatModel(["{}"]))
    sampling = SamplingParams(seed=base)
    got = [vs._seeded(sampling).seed for _ in range(5)]
    assert got == [((base or 0) * M + calls_made) % 2**31 for calls_made in range(1, 6)]
    assert sampling.seed == base  # a copy: the seat's own sampling keeps its seed


@pytest.mark.parametrize("panel_seed", BASES)
@pytest.mark.parametrize("simulator_id", ["frozen:embedded", "vs-prob:scripted", "pool:m0001-step16@0123abcd", "", "persona-guided:ünï"])
def test_evaluation_simulator_seed_matches_the_old_formula(panel_seed, simulator_id):
    """evaluation/evaluate.py ``simulator_seed``: ``(panel_seed * 1_000_003 + crc32(id)) % 2**31``."""
    expected = (panel_seed * M + zlib.crc32(simulator_id.encode())) % 2**31
    assert simulator_seed(panel_seed, simulator_id) == expected
    assert 0 <= simulator_seed(panel_seed, simulator_id) < 2**31


@pytest.mark.parametrize("seed", BASES)
def test_gamma_sample_plain_batch_seeds_match_the_old_formula(seed):
    """evaluation/gamma.py ``sample_plain``: ``seed * 1_000_003 + len(out)``, no modulo."""
    seeds: list = []
    simulator = FrozenSimulator(SeedRecorder(["Fine."], seeds), SamplingParams(seed=123), simulator_id="frozen")
    task = SayTheWord(num_tasks=1).tasks()[0]
    state = SimulatorTurn("e0", task, [Message(role="system", content="You are a user."), Message(role="user", content="Hi")])
    replies = sample_plain(simulator, state, m=10, seed=seed, batch=3)
    assert replies == ["Fine."] * 10
    assert seeds == [seed * M + drawn for drawn in (0, 3, 6, 9)]
    assert simulator.seat.sampling.seed == 123  # the seat is restored afterwards


def old_next_tasks(tasks, seed, count):
    out = []
    for cursor in range(count):
        epoch, index = divmod(cursor, len(tasks))
        order = list(range(len(tasks)))
        random.Random(seed * M + epoch).shuffle(order)
        out.append(tasks[order[index]])
    return out


@pytest.mark.parametrize("seed", BASES)
def test_trainer_task_order_matches_the_old_formula(seed):
    """training/trainer.py ``next_tasks``: ``random.Random(seed * 1_000_003 + epoch)``, driven on a stand-in trainer."""
    from scope_marl.training.trainer import Trainer

    env = SayTheWord(num_tasks=7)
    tasks = env.tasks("train")
    trainer = SimpleNamespace(env=env, cfg=SimpleNamespace(seed=seed, tasks_per_step=3 * len(tasks) + 2, task_ids=None), cursor=0)
    trainer.train_tasks = lambda: Trainer.train_tasks(trainer)
    got = Trainer.next_tasks(trainer)
    assert [t.task_id for t in got] == [t.task_id for t in old_next_tasks(tasks, seed, 3 * len(tasks) + 2)]
    assert trainer.cursor == 3 * len(tasks) + 2
    for epoch in KEYS:
        assert derive_seed(seed, epoch) == seed * M + epoch


def make_adapter(directory: Path, weight: float) -> Path:
    """A saved adapter folder whose one tensor tells the members apart."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text(json.dumps({"r": 8}))
    save_file({"w": torch.full((1,), weight)}, str(directory / "adapter_model.safetensors"))
    return directory


@pytest.fixture
def pool(tmp_path) -> SimulatorPool:
    """Eight members, so a different seed usually draws a different one."""
    pool = SimulatorPool(tmp_path / "pool", max_size=10, selection="random", seed=0)
    for i in range(8):
        pool.add(make_adapter(tmp_path / "source", float(i)), step=i)
    return pool


@pytest.mark.parametrize("seed", BASES)
def test_trainer_pool_member_matches_the_old_formula(seed, pool, tmp_path):
    """training/population.py ``Population.draw``: ``random.Random(seed * 1_000_003 + step)``."""
    from scope_marl.training.population import Population

    loaded = []
    chat = SimpleNamespace(set_adapter_tensors=lambda name, tensors: loaded.append(tensors["w"].item()))
    engine = SimpleNamespace(simulator=SimpleNamespace(simulator_id="trainable"))
    for step in (0, 1, 5, 16, 1000):
        population = Population(SimpleNamespace(every=1), seed, tmp_path, chat, "simulator", engine)
        population.pool = pool
        population.draw(step)
        expected = pool.select(rng=random.Random(seed * M + step), scores={})
        assert population.member == expected.member_id and engine.simulator.simulator_id == f"trainable:{expected.member_id}"
        assert loaded[-1] == pool.members.index(expected)  # member i holds weight i


@pytest.mark.parametrize("seed", BASES)
def test_rotation_random_order_picks_the_member_of_the_old_formula(seed):
    """simulators/rotation.py ``Rotation.for_group``: ``random.Random(seed * 1_000_003 + group).choice(members)``."""
    members = [FrozenSimulator(ScriptedChatModel([f"I am {name}."]), simulator_id=name) for name in "abcde"]
    rotation = Rotation(members, order="random", seed=seed)
    groups = [0, 1, 2, 3, 10, 99, 12345]
    picked = [rotation.for_group(g).simulator_id for g in groups]
    assert picked == [random.Random(seed * M + g).choice(members).simulator_id for g in groups]


class FakeAdapterModel:
    """Just enough of HFChatModel for PopulationSimulator to load adapters by name."""

    name = "fake"

    def __init__(self):
        self.adapters: list[str] = []
        self.model = SimpleNamespace(delete_adapter=self.adapters.remove)

    def add_adapter(self, name, path):
        self.adapters.append(name)


@pytest.mark.parametrize("seed", BASES)
def test_population_simulator_draws_the_member_of_the_old_formula(seed, pool):
    """simulators/population.py ``PopulationSimulator.for_group``: ``pool.select(rng=random.Random(seed * 1_000_003 + group))``."""
    population = PopulationSimulator(pool, FakeAdapterModel(), seed=seed)
    for group in (0, 1, 2, 7, 64, 4321):
        expected = pool.select(rng=random.Random(seed * M + group), scores={})
        assert population.for_group(group).simulator_id == f"pool:{expected.member_id}@{expected.content_hash[:12]}"


@pytest.mark.parametrize("seed", BASES)
def test_lab_population_acts_draws_the_member_of_the_old_formula(seed, tmp_path):
    """lab/simulators.py ``PopulationActs.for_group``: ``pool.select(rng=random.Random(seed * 1_000_003 + group))``."""
    from scope_marl.lab.games.theory import theory_game
    from scope_marl.lab.simulators import FrozenActs, PopulationActs, TrainableActs

    game = theory_game()
    trainable = TrainableActs(FrozenActs.sharpened(game, 4.0, adherence=0.5))
    pool = SimulatorPool(tmp_path / "pool", max_size=10, selection="random", seed=0)
    for i in range(6):
        pool.add(trainable.save(tmp_path / f"staging-{i}"), step=i)
    population = PopulationActs(pool, game, trainable.adherence, seed)
    for group in (0, 1, 2, 7, 64, 4321):
        expected = pool.select(rng=random.Random(seed * M + group))
        assert population.for_group(group).simulator_id == f"pool:{expected.member_id}"


# ---- engine counters -----------------------------------------------------------------------------


def engine_with(seeds: list, seed: int = 4) -> RolloutEngine:
    members = [FrozenSimulator(SeedRecorder([f"I am {name}."], seeds), simulator_id=name) for name in "abcd"]
    return RolloutEngine(
        SayTheWord(num_tasks=3, max_exchanges=2),
        Seat(model=SeedRecorder(["Say it."], seeds)),
        Rotation(members, order="random", seed=seed),
        RolloutConfig(progress=False, group_size=2, seed=seed),
    )


def test_engine_state_dict_carries_the_group_counter():
    first_seeds: list = []
    first = engine_with(first_seeds)
    tasks = first.env.tasks()
    first.run(tasks)
    state = first.state_dict()
    assert state == {"groups": len(tasks)} and first_seeds
    del first_seeds[:]
    expected = first.run(tasks)

    resumed_seeds: list = []
    resumed = engine_with(resumed_seeds)
    resumed.load_state_dict(state)
    got = resumed.run(tasks)
    assert [e.episode_id for e in got] == [e.episode_id for e in expected]
    assert [e.group_id for e in got] == [e.group_id for e in expected]
    assert [e.simulator_id for e in got] == [e.simulator_id for e in expected]
    assert resumed_seeds == first_seeds
    assert resumed.state_dict() == first.state_dict()

    # Without the state, a fresh engine starts its groups and seeds from zero again.
    fresh_seeds: list = []
    fresh = engine_with(fresh_seeds).run(tasks)
    assert [e.group_id for e in fresh] != [e.group_id for e in expected]
    assert fresh_seeds != first_seeds
