"""The core layer: derive_seed gives every call site its old seed, atomic files, the run layout, engine counters."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from scope_marl.backends.scripted import ScriptedChatModel
from scope_marl.backends.seat import Seat
from scope_marl.config import RolloutConfig
from scope_marl.core import run_layout
from scope_marl.core.files import atomic_directory, atomic_file, write_json, write_text
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


def make_adapter(directory: Path, payload: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text(json.dumps({"r": 8}))
    (directory / "adapter_model.safetensors").write_bytes(payload)
    return directory


@pytest.fixture
def pool(tmp_path) -> SimulatorPool:
    """Eight members, so a different seed usually draws a different one."""
    pool = SimulatorPool(tmp_path / "pool", max_size=10, selection="random", seed=0)
    for i in range(8):
        pool.add(make_adapter(tmp_path / "source", f"weights-{i}".encode()), step=i)
    return pool


@pytest.mark.parametrize("seed", BASES)
def test_trainer_pool_member_matches_the_old_formula(seed, pool, tmp_path):
    """training/population.py ``Population.draw``: ``random.Random(seed * 1_000_003 + step)``."""
    from scope_marl.training.population import Population

    loaded = []
    chat = SimpleNamespace(load_adapter_weights=lambda name, path: loaded.append(path))
    engine = SimpleNamespace(simulator=SimpleNamespace(simulator_id="trainable"))
    for step in (0, 1, 5, 16, 1000):
        population = Population(SimpleNamespace(every=1), seed, tmp_path, chat, "simulator", engine)
        population.pool = pool
        population.draw(step)
        expected = pool.select(rng=random.Random(seed * M + step), scores={})
        assert population.member == expected.member_id and engine.simulator.simulator_id == f"trainable:{expected.member_id}"
        assert loaded[-1] == Path(expected.path)


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


# ---- atomic files --------------------------------------------------------------------------------


def test_write_text_replaces_old_content_and_creates_parents(tmp_path):
    path = tmp_path / "a" / "b" / "note.txt"
    assert write_text(path, "old") == path
    write_text(path, "new, longer content")
    assert path.read_text() == "new, longer content"
    assert sorted(os.listdir(path.parent)) == ["note.txt"]


def test_write_json_ends_with_a_newline_and_round_trips(tmp_path):
    data = {"step": 3, "best": [0.5, "step-000002"], "name": "ünï"}
    path = write_json(tmp_path / "deep" / "state.json", data)
    text = path.read_text()
    assert text.endswith("}\n") and json.loads(text) == data
    assert write_json(tmp_path / "flat.json", [1, 2], indent=None).read_text() == "[1, 2]\n"


def test_an_error_inside_atomic_file_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(b"\x00old bytes\xff")
    with pytest.raises(RuntimeError, match="half way"), atomic_file(path, "wb") as handle:
        handle.write(b"new" * 1000)
        raise RuntimeError("half way")
    assert path.read_bytes() == b"\x00old bytes\xff"
    assert os.listdir(tmp_path) == ["data.bin"]

    with atomic_file(path, "wb", durable=False) as handle:
        handle.write(b"new")
    assert path.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["data.bin"]


def test_a_process_killed_mid_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "state.json"
    old = json.dumps({"step": 1}) + "\n"
    path.write_text(old)
    script = (
        "import os, signal, sys\n"
        "from scope_marl.core.files import atomic_file\n"
        "with atomic_file(sys.argv[1]) as handle:\n"
        "    handle.write('x' * 3_000_000)\n"
        "    handle.flush()\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "    handle.write('y' * 3_000_000)\n"
    )
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", script, str(path)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert path.read_text() == old
    leftovers = [name for name in os.listdir(tmp_path) if name != "state.json"]
    assert leftovers, "the kill should have struck inside the with block, with the temporary written"
    for name in leftovers:
        assert name.startswith(".") and name.endswith(".tmp"), name
    # The temporary holds the first half: the process really died mid-write.
    assert (tmp_path / leftovers[0]).read_text() == "x" * 3_000_000


def fill(directory: Path, text: str) -> None:
    (directory / "sub").mkdir()
    (directory / "a.txt").write_text(text)
    (directory / "sub" / "b.txt").write_text(text * 2)


def tree(directory: Path) -> dict:
    return {str(p.relative_to(directory)): p.read_text() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_atomic_directory_replaces_an_existing_target(tmp_path):
    target = tmp_path / "parent" / "ckpt"
    with atomic_directory(target) as tmp:
        assert tmp.parent == target.parent and tmp.name.startswith(".ckpt.") and tmp.name.endswith(".tmp")
        assert list(tmp.iterdir()) == []
        fill(tmp, "old")
    assert tree(target) == {"a.txt": "old", "sub/b.txt": "oldold"}
    with atomic_directory(target, if_exists="replace") as tmp:
        (tmp / "only.txt").write_text("new")
    assert tree(target) == {"only.txt": "new"}
    assert os.listdir(target.parent) == ["ckpt"]


def test_atomic_directory_keep_leaves_the_existing_target(tmp_path):
    target = tmp_path / "member"
    with atomic_directory(target) as tmp:
        fill(tmp, "theirs")
    with atomic_directory(target, if_exists="keep") as tmp:
        fill(tmp, "mine")
    assert tree(target) == {"a.txt": "theirs", "sub/b.txt": "theirstheirs"}
    assert os.listdir(tmp_path) == ["member"]
    # With no target yet, keep still installs the new copy.
    with atomic_directory(tmp_path / "fresh", if_exists="keep") as tmp:
        fill(tmp, "mine")
    assert tree(tmp_path / "fresh") == {"a.txt": "mine", "sub/b.txt": "minemine"}


def test_an_error_inside_atomic_directory_keeps_the_old_directory(tmp_path):
    target = tmp_path / "ckpt"
    target.mkdir()
    fill(target, "old")
    with pytest.raises(KeyboardInterrupt), atomic_directory(target) as tmp:
        fill(tmp, "new")
        raise KeyboardInterrupt
    assert tree(target) == {"a.txt": "old", "sub/b.txt": "oldold"}
    assert os.listdir(tmp_path) == ["ckpt"]


def test_atomic_directory_rejects_an_unknown_if_exists(tmp_path):
    with pytest.raises(ValueError, match="if_exists must be 'replace' or 'keep'"), atomic_directory(tmp_path / "x", if_exists="merge"):
        pass
    assert os.listdir(tmp_path) == []


# ---- run layout ----------------------------------------------------------------------------------


def make_checkpoint(run_dir: Path, step: int, best: str | None = None) -> Path:
    path = run_layout.checkpoint_dir(run_dir, step)
    path.mkdir(parents=True)
    state = {"step": step, "cursor": 0, "best": [0.5, best] if best else None}
    (path / run_layout.STATE).write_text(json.dumps(state))
    return path


def test_list_checkpoints_skips_incomplete_and_temporary_folders(tmp_path):
    first = make_checkpoint(tmp_path, 1)
    third = make_checkpoint(tmp_path, 3)
    (tmp_path / "checkpoints" / "step-000002").mkdir()  # no state.json: an interrupted save
    temporary = tmp_path / "checkpoints" / ".step-000004.abc.tmp"
    temporary.mkdir()
    (temporary / run_layout.STATE).write_text("{}")
    assert run_layout.list_checkpoints(tmp_path) == [first, third]
    assert run_layout.list_checkpoints(tmp_path / "elsewhere") == []


def test_resolve_checkpoint_finds_the_best_else_the_last(tmp_path):
    first = make_checkpoint(tmp_path, 1)
    assert run_layout.resolve_checkpoint(first) == first
    second = make_checkpoint(tmp_path, 2)
    assert run_layout.resolve_checkpoint(tmp_path) == second  # no best recorded: the last
    make_checkpoint(tmp_path, 3, best="step-000001")
    assert run_layout.resolve_checkpoint(tmp_path) == first
    # Older runs wrote the best as a path; its name is what counts.
    make_checkpoint(tmp_path, 4, best=str(Path("/elsewhere/checkpoints/step-000002")))
    assert run_layout.resolve_checkpoint(tmp_path) == second
    # A best that was deleted falls back to the last.
    last = make_checkpoint(tmp_path, 5, best="step-000000")
    assert run_layout.resolve_checkpoint(tmp_path) == last


def test_resolve_checkpoint_on_an_empty_directory_names_run_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="RUN_DIR"):
        run_layout.resolve_checkpoint(tmp_path)


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
