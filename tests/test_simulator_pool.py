"""SimulatorPool: distinct immutable members, FIFO eviction, selection modes, manifest round trip."""

from __future__ import annotations

import json
import os
import random
import stat
from collections import Counter
from pathlib import Path

import pytest

from scope_marl.simulators.pool import (
    PoolIntegrityError,
    PoolManifestError,
    SimulatorPool,
    directory_hash,
)


def make_adapter(directory: Path, payload: bytes = b"weights-0") -> Path:
    """A stand-in for peft's save_pretrained output."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16}))
    (directory / "adapter_model.safetensors").write_bytes(payload)
    return directory


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """One checkpoint directory that the 'trainer' keeps overwriting, like the reference release."""
    return make_adapter(tmp_path / "ckpt")


def fill(pool: SimulatorPool, source: Path, n: int, every: int = 16) -> list:
    members = []
    for i in range(n):
        make_adapter(source, f"weights-{i}".encode())
        members.append(pool.add(source, step=i * every))
    return members


# ----------------------------------------------------------------------------- storage


def test_members_are_distinct_copies(tmp_path, source):
    pool = SimulatorPool(tmp_path / "pool")
    first = pool.add(source, step=0)
    make_adapter(source, b"weights-1")  # the trainer overwrites its checkpoint in place
    second = pool.add(source, step=16)

    assert first.path != second.path
    assert Path(first.path).parent == Path(second.path).parent == (tmp_path / "pool" / "members").resolve()
    assert Path(first.path).name == first.member_id == "m0000-step0"
    assert second.member_id == "m0001-step16"
    # Copying means the later overwrite did not reach the first member.
    assert (Path(first.path) / "adapter_model.safetensors").read_bytes() == b"weights-0"
    assert (Path(second.path) / "adapter_model.safetensors").read_bytes() == b"weights-1"
    assert first.content_hash != second.content_hash

    make_adapter(source, b"weights-2")
    assert (Path(second.path) / "adapter_model.safetensors").read_bytes() == b"weights-1"
    pool.verify()


def test_rewind_drops_later_members_and_reuses_their_ids(tmp_path, source):
    """A run resumed from step 16 plays step 32 again: the step-32 snapshot is dropped (directory
    too) and its id is given out again; the manifest on disk says the same."""
    pool = SimulatorPool(tmp_path / "pool", max_size=5)
    members = fill(pool, source, 3)
    assert pool.rewind(16) == [members[2].member_id] and pool.rewind(16) == []
    assert not Path(members[2].path).exists()
    assert [m.member_id for m in SimulatorPool.load(tmp_path / "pool").members] == ["m0000-step0", "m0001-step16"]
    make_adapter(source, b"weights-again")
    assert pool.add(source, step=32).member_id == members[2].member_id == "m0002-step32"


def test_content_hash_depends_on_content_not_location(tmp_path):
    a = make_adapter(tmp_path / "a", b"same")
    b = make_adapter(tmp_path / "elsewhere" / "b", b"same")
    c = make_adapter(tmp_path / "c", b"different")
    assert directory_hash(a) == directory_hash(b)
    assert directory_hash(a) != directory_hash(c)
    assert len(directory_hash(a)) == 64

    # File names count, not just bytes.
    d = tmp_path / "d"
    d.mkdir()
    (d / "adapter_config.json").write_text((a / "adapter_config.json").read_text())
    (d / "renamed.safetensors").write_bytes(b"same")
    assert directory_hash(d) != directory_hash(a)


def test_identical_snapshots_are_separate_members(tmp_path, source):
    pool = SimulatorPool(tmp_path / "pool")
    a = pool.add(source, step=0)
    b = pool.add(source, step=16)  # unchanged content: still its own member and directory
    assert len(pool) == 2
    assert a.content_hash == b.content_hash
    assert a.path != b.path and Path(a.path).is_dir() and Path(b.path).is_dir()


def test_member_files_are_read_only(tmp_path, source):
    pool = SimulatorPool(tmp_path / "pool")
    member = pool.add(source, step=0)
    files = [p for p in Path(member.path).rglob("*") if p.is_file()]
    assert {p.name for p in files} == {"adapter_config.json", "adapter_model.safetensors"}
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) & 0o222 == 0, p
    assert stat.S_IMODE(Path(member.path).stat().st_mode) & 0o222 == 0
    # The source is left as it was.
    assert os.access(source / "adapter_model.safetensors", os.W_OK)


def test_no_temp_directories_left_behind(tmp_path, source):
    pool = SimulatorPool(tmp_path / "pool")
    fill(pool, source, 3)
    names = sorted(p.name for p in (tmp_path / "pool" / "members").iterdir())
    assert names == [m.member_id for m in pool.members]


def test_missing_or_empty_source_is_refused(tmp_path):
    pool = SimulatorPool(tmp_path / "pool")
    with pytest.raises(ValueError, match="does not exist"):
        pool.add(tmp_path / "nope", step=0)
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(ValueError, match="contains no files"):
        pool.add(tmp_path / "empty", step=0)
    assert len(pool) == 0
    assert list((tmp_path / "pool" / "members").iterdir()) == []


def test_base_flag_only_for_first_member(tmp_path, source):
    pool = SimulatorPool(tmp_path / "pool")
    base = pool.add(source, step=0, base=True)
    assert base.pinned
    with pytest.raises(ValueError, match="only the first member is the base"):
        pool.add(source, step=16, base=True)
    assert not pool.add(source, step=16).pinned


def test_get(tmp_path, source):
    pool = SimulatorPool(tmp_path / "pool")
    member = pool.add(source, step=0)
    assert pool.get(member.member_id) == member
    with pytest.raises(KeyError, match="m0099"):
        pool.get("m0099-step0")


def test_new_pool_refuses_existing_root(tmp_path, source):
    SimulatorPool(tmp_path / "pool").add(source, step=0)
    with pytest.raises(FileExistsError, match="SimulatorPool.load"):
        SimulatorPool(tmp_path / "pool")


@pytest.mark.parametrize(
    "kwargs", [{"max_size": 0}, {"max_size": 1}, {"priority_floor": 0.0}, {"priority_floor": 1.5}, {"selection": "best"}]
)
def test_invalid_settings(tmp_path, kwargs):
    with pytest.raises(ValueError):
        SimulatorPool(tmp_path / "pool", **kwargs)


# ---------------------------------------------------------------------------- eviction


def test_fifo_eviction_keeps_pinned_base(tmp_path, source):
    pool = SimulatorPool(tmp_path / "pool", max_size=3)
    base, m1, m2, m3, m4 = fill(pool, source, 5)
    assert base.pinned and not m1.pinned
    assert [m.member_id for m in pool.members] == [base.member_id, m3.member_id, m4.member_id]
    assert Path(base.path).is_dir()
    assert not Path(m1.path).exists() and not Path(m2.path).exists()
    assert Path(m3.path).is_dir() and Path(m4.path).is_dir()
    # Ids are never reused after eviction.
    assert len({m.member_id for m in (base, m1, m2, m3, m4)}) == 5
    pool.verify()


def test_base_can_be_evicted_when_not_pinned(tmp_path, source):
    pool = SimulatorPool(tmp_path / "pool", max_size=2, pin_base=False)
    base, m1, m2 = fill(pool, source, 3)
    assert not base.pinned
    assert [m.member_id for m in pool.members] == [m1.member_id, m2.member_id]
    assert not Path(base.path).exists()


def test_max_size_one_without_pinning(tmp_path, source):
    pool = SimulatorPool(tmp_path / "pool", max_size=1, pin_base=False)
    _, last = fill(pool, source, 2)
    assert pool.members == [last]


# --------------------------------------------------------------------------- selection


def test_latest_returns_newest(tmp_path, source):
    pool = SimulatorPool(tmp_path / "pool", selection="latest")
    members = fill(pool, source, 4)
    assert pool.select() == members[-1]
    assert pool.select(scores={members[-1].member_id: 1.0}) == members[-1]


def test_random_is_uniform_and_seeded(tmp_path, source):
    pool = SimulatorPool(tmp_path / "pool", selection="random", seed=7)
    members = fill(pool, source, 4)
    n = 4000
    rng = random.Random(123)
    counts = Counter(pool.select(rng=rng).member_id for _ in range(n))
    assert set(counts) == {m.member_id for m in members}
    for c in counts.values():
        assert abs(c - n / 4) < 0.1 * n / 4  # within 10% of uniform (about 4 sigma)

    # Same seed -> same sequence, for both external and internal RNGs.
    a = [pool.select(rng=random.Random(5)).member_id for _ in range(3)]
    b = [pool.select(rng=random.Random(5)).member_id for _ in range(3)]
    assert a == b
    other = SimulatorPool(tmp_path / "pool2", selection="random", seed=7)
    fill(other, source, 4)
    seq1 = [pool.select().member_id for _ in range(50)]
    seq2 = [other.select().member_id for _ in range(50)]
    assert seq1 == seq2


def test_external_rng_leaves_internal_state_alone(tmp_path, source):
    pool = SimulatorPool(tmp_path / "pool", seed=3)
    fill(pool, source, 5)
    twin = SimulatorPool(tmp_path / "twin", seed=3)
    fill(twin, source, 5)
    for _ in range(10):
        pool.select(rng=random.Random(99))
    assert [pool.select().member_id for _ in range(20)] == [twin.select().member_id for _ in range(20)]


def test_prioritized_prefers_hardest_but_keeps_all(tmp_path, source):
    pool = SimulatorPool(tmp_path / "pool", selection="prioritized", priority_floor=0.1, seed=1)
    easy, medium, hard = fill(pool, source, 3)
    scores = {easy.member_id: 0.9, medium.member_id: 0.5, hard.member_id: 0.1}

    weights = pool.priority_weights(scores)
    assert weights[hard.member_id] == pytest.approx(1.0)
    assert weights[medium.member_id] == pytest.approx(0.55)
    assert weights[easy.member_id] == pytest.approx(0.1)

    n = 6000
    rng = random.Random(1)
    counts = Counter(pool.select(rng=rng, scores=scores).member_id for _ in range(n))
    assert counts[hard.member_id] > counts[medium.member_id] > counts[easy.member_id]
    total_w = 1.0 + 0.55 + 0.1
    assert counts[easy.member_id] / n == pytest.approx(0.1 / total_w, abs=0.02)  # the floor keeps it in play
    assert counts[hard.member_id] / n == pytest.approx(1.0 / total_w, abs=0.03)

    # The internal RNG is seeded too: two pools with the same seed pick the same sequence.
    twin = SimulatorPool(tmp_path / "twin", selection="prioritized", priority_floor=0.1, seed=1)
    fill(twin, source, 3)
    assert [pool.select(scores=scores).member_id for _ in range(40)] == [twin.select(scores=scores).member_id for _ in range(40)]


def test_prioritized_unscored_members_get_max_weight(tmp_path, source):
    pool = SimulatorPool(tmp_path / "pool", selection="prioritized", priority_floor=0.2)
    old, new = fill(pool, source, 2)
    weights = pool.priority_weights({old.member_id: 0.3, "m9999-evicted": 0.0})
    # With one scored member the spread is zero: it counts as hardest; the unscored one is max too.
    assert weights == {old.member_id: 1.0, new.member_id: 1.0}
    weights = pool.priority_weights({old.member_id: 0.3, "m9999-evicted": 0.0, new.member_id: 0.8})
    assert weights == {old.member_id: pytest.approx(1.0), new.member_id: pytest.approx(0.2)}
    assert pool.priority_weights(None) == {old.member_id: 1.0, new.member_id: 1.0}
    with pytest.raises(ValueError, match="finite"):
        pool.priority_weights({old.member_id: float("nan")})


def test_select_on_empty_pool(tmp_path):
    with pytest.raises(Exception, match="empty"):
        SimulatorPool(tmp_path / "pool").select()


# ---------------------------------------------------------------------------- manifest


def test_manifest_contents(tmp_path, source):
    pool = SimulatorPool(tmp_path / "pool", max_size=4, selection="prioritized", seed=11)
    members = fill(pool, source, 2)
    data = json.loads((tmp_path / "pool" / "manifest.json").read_text())
    assert data["settings"] == {"max_size": 4, "pin_base": True, "selection": "prioritized", "priority_floor": 0.1, "seed": 11}
    assert data["next_index"] == 2
    assert [m["member_id"] for m in data["members"]] == [m.member_id for m in members]
    assert [m["path"] for m in data["members"]] == [f"members/{m.member_id}" for m in members]  # relative
    assert [m["content_hash"] for m in data["members"]] == [m.content_hash for m in members]
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "pool").iterdir())


def test_reload_restores_members_and_continues_selection(tmp_path, source):
    root = tmp_path / "pool"
    pool = SimulatorPool(root, max_size=3, selection="random", seed=42)
    fill(pool, source, 5)
    [pool.select() for _ in range(7)]

    reloaded = SimulatorPool.load(root)
    assert reloaded.members == pool.members
    assert [m.content_hash for m in reloaded.members] == [m.content_hash for m in pool.members]
    assert (reloaded.max_size, reloaded.pin_base, reloaded.selection, reloaded.seed) == (3, True, "random", 42)

    # Selection after the restart is exactly what the uninterrupted pool selects next.
    expected = [pool.select().member_id for _ in range(30)]
    assert [reloaded.select().member_id for _ in range(30)] == expected

    # Adding after a reload keeps counting ids and evicting FIFO.
    new = SimulatorPool.load(root).add(source, step=999)
    assert new.member_id == "m0005-step999"


def test_reload_from_moved_directory(tmp_path, source):
    pool = SimulatorPool(tmp_path / "pool")
    fill(pool, source, 2)
    os.rename(tmp_path / "pool", tmp_path / "moved")
    reloaded = SimulatorPool.load(tmp_path / "moved")
    assert all(Path(m.path).parent == (tmp_path / "moved" / "members").resolve() for m in reloaded.members)


def test_verify_detects_tampering(tmp_path, source):
    pool = SimulatorPool(tmp_path / "pool")
    member = fill(pool, source, 2)[1]
    pool.verify()
    target = Path(member.path) / "adapter_model.safetensors"
    os.chmod(target, 0o644)
    target.write_bytes(b"overwritten by a careless trainer")
    with pytest.raises(PoolIntegrityError, match=member.member_id):
        pool.verify()
    with pytest.raises(PoolIntegrityError, match="content changed"):
        SimulatorPool.load(tmp_path / "pool")
    assert len(SimulatorPool.load(tmp_path / "pool", verify=False)) == 2


def test_verify_detects_missing_directory(tmp_path, source):
    pool = SimulatorPool(tmp_path / "pool")
    member = pool.add(source, step=0)
    os.chmod(member.path, 0o755)
    for p in Path(member.path).iterdir():
        p.unlink()
    Path(member.path).rmdir()
    with pytest.raises(PoolIntegrityError, match="missing"):
        pool.verify()


def test_missing_manifest_error(tmp_path):
    with pytest.raises(PoolManifestError, match="no pool manifest at .*manifest.json"):
        SimulatorPool.load(tmp_path / "nowhere")


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        '{"version": 1}',
        '{"version": 1, "settings": {"max_size": 0, "pin_base": true, "selection": "random", "priority_floor": 0.1, "seed": 0}, '
        '"next_index": 0, "selections": 0, "rng_state": [3, [], null], "members": []}',
    ],
)
def test_corrupt_manifest_error(tmp_path, source, content):
    pool = SimulatorPool(tmp_path / "pool")
    pool.add(source, step=0)
    (tmp_path / "pool" / "manifest.json").write_text(content)
    with pytest.raises(PoolManifestError, match="corrupt pool manifest .*manifest.json") as info:
        SimulatorPool.load(tmp_path / "pool")
    assert "To fix" in str(info.value)


def test_manifest_path_escape_is_rejected(tmp_path, source):
    pool = SimulatorPool(tmp_path / "pool")
    pool.add(source, step=0)
    path = tmp_path / "pool" / "manifest.json"
    data = json.loads(path.read_text())
    data["members"][0]["path"] = "../ckpt"
    path.write_text(json.dumps(data))
    with pytest.raises(PoolManifestError, match="points outside"):
        SimulatorPool.load(tmp_path / "pool")
