"""The snapshot pool behind Population Co-Training: storage and selection of simulator checkpoints.

Population Co-Training keeps several saved versions of the trainable user simulator (the initial
one included) and picks one to play the user before every rollout group, so the agent cannot
overfit to whichever simulator is current. A member here is a *directory* (for us a LoRA adapter
written by peft's ``save_pretrained``: ``adapter_config.json`` + ``adapter_model.safetensors``);
this module never loads a model, so it can be tested without torch.

Why members are copies, read-only and hashed: the reference release stored every pool entry as
the same checkpoint path, which the trainer kept overwriting, so the "population" was the latest
simulator ten times over. Here :meth:`SimulatorPool.add` copies the snapshot into a directory of
its own (``<root>/members/<member_id>/``), marks its files read-only, and records a SHA-256 of its
content; :meth:`SimulatorPool.verify` recomputes the hashes and fails loudly if a member changed.
Read-only bits only express intent (root, or anyone who chmods, can still write); the hash is
what actually catches a modified member.

Decisions worth knowing:

* A snapshot whose content equals an existing member's is still added as a member of its own (a
  new directory): the pool is a history of snapshots, not a set, and de-duplicating would make
  FIFO eviction and selection weights depend on training luck. Equal hashes are easy to spot in
  the manifest.
* The first member ever added is the base; with ``pin_base`` it is never evicted.
* ``<root>/manifest.json`` holds the settings, the members, the id counter and the full state of
  the internal selection RNG. It is rewritten atomically after every change, including every
  :meth:`~SimulatorPool.select` that uses the internal RNG, so :meth:`SimulatorPool.load`
  continues exactly the selection sequence an uninterrupted run would have produced.
* One process owns a pool root at a time; there is no locking.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import stat
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scope_marl.core import files

Selection = Literal["random", "latest", "prioritized"]

MANIFEST_NAME = "manifest.json"
MEMBERS_DIR = "members"
MANIFEST_VERSION = 1

_READ_ONLY_FILE = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH  # 0o444
_READ_ONLY_DIR = _READ_ONLY_FILE | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH  # 0o555
_WRITABLE_DIR = _READ_ONLY_DIR | stat.S_IWUSR  # 0o755


class PoolError(Exception):
    """Base class for pool errors."""


class PoolManifestError(PoolError, ValueError):
    """The manifest is missing, unreadable or inconsistent."""


class PoolIntegrityError(PoolError, RuntimeError):
    """A member's directory is missing or its content no longer matches its recorded hash."""


class PoolMember(BaseModel):
    """One immutable snapshot of the simulator. ``path`` is absolute at run time; the manifest
    stores it relative to the pool root so a pool directory can be moved or copied whole."""

    model_config = ConfigDict(frozen=True)

    member_id: str  # "m0003-step48": insertion index (never reused) and training step
    step: int
    path: str
    content_hash: str
    pinned: bool = False
    created: float


class _Settings(BaseModel):
    max_size: int = Field(ge=1)
    pin_base: bool
    selection: Selection
    priority_floor: float = Field(gt=0.0, le=1.0)
    seed: int


class _Manifest(BaseModel):
    version: int
    settings: _Settings
    next_index: int = Field(ge=0)  # member ids are never reused, even after eviction
    selections: int = Field(ge=0)  # how many selections used the internal RNG (informative)
    rng_state: list[Any]  # random.Random.getstate() as JSON: [version, [625 ints], gauss_next]
    members: list[PoolMember]  # oldest first; ``path`` relative to the pool root


def directory_hash(directory: str | os.PathLike[str]) -> str:
    """SHA-256 over every regular file under ``directory``: relative POSIX path and bytes, in
    sorted path order, each length-prefixed so that no two different trees hash alike. Empty
    directories and file metadata (times, modes) do not count: only what a loader would read."""
    directory = Path(directory)
    files = sorted((p.relative_to(directory).as_posix(), p) for p in directory.rglob("*") if p.is_file())
    digest = hashlib.sha256()
    for rel, path in files:
        name = rel.encode("utf-8")
        digest.update(len(name).to_bytes(8, "big"))
        digest.update(name)
        digest.update(path.stat().st_size.to_bytes(8, "big"))
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _make_read_only(directory: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(directory, topdown=False):
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), _READ_ONLY_FILE)
        os.chmod(dirpath, _READ_ONLY_DIR)


def _remove_tree(directory: Path) -> None:
    # Read-only directories block unlinking their entries (for non-root users), so reopen them first.
    if not directory.exists():
        return
    for dirpath, _dirnames, _filenames in os.walk(directory):
        os.chmod(dirpath, _WRITABLE_DIR)
    shutil.rmtree(directory)


class SimulatorPool:
    """A bounded pool of immutable simulator snapshots with FIFO eviction and per-group selection.

    ``SimulatorPool(root, ...)`` creates a new pool (``root`` must not hold one already);
    :meth:`load` reopens an existing one.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        max_size: int = 10,
        pin_base: bool = True,
        selection: Selection = "random",
        priority_floor: float = 0.1,
        seed: int = 0,
    ):
        root = Path(root)
        if (root / MANIFEST_NAME).exists():
            raise FileExistsError(
                f"{root / MANIFEST_NAME} already exists: reopen that pool with SimulatorPool.load({str(root)!r}) "
                "or choose an empty directory for a new one."
            )
        settings = _validated_settings(max_size=max_size, pin_base=pin_base, selection=selection, priority_floor=priority_floor, seed=seed)
        rng = random.Random(seed)
        self._setup(root, settings, next_index=0, selections=0, rng=rng, members=[])
        (self.root / MEMBERS_DIR).mkdir(parents=True, exist_ok=True)
        self._save()

    def _setup(
        self, root: Path, settings: _Settings, next_index: int, selections: int, rng: random.Random, members: list[PoolMember]
    ) -> None:
        self.root = root.resolve()
        self.max_size = settings.max_size
        self.pin_base = settings.pin_base
        self.selection: Selection = settings.selection
        self.priority_floor = settings.priority_floor
        self.seed = settings.seed
        self._next_index = next_index
        self._selections = selections
        self._rng = rng
        self._members = members

    # ------------------------------------------------------------------ members

    @property
    def members(self) -> list[PoolMember]:
        """The current members, oldest first (a copy)."""
        return list(self._members)

    def __len__(self) -> int:
        return len(self._members)

    def get(self, member_id: str) -> PoolMember:
        for member in self._members:
            if member.member_id == member_id:
                return member
        raise KeyError(
            f"no member {member_id!r} in the pool at {self.root} (it may have been evicted); members: {[m.member_id for m in self._members]}"
        )

    def add(self, source_dir: str | os.PathLike[str], step: int, base: bool = False) -> PoolMember:
        """Copy ``source_dir`` into a new member directory and return the member.

        The first member ever added is the base (pinned when ``pin_base``); ``base=True`` only
        asserts that. Identical content to an existing member still becomes a member of its own.
        Evicts the oldest unpinned member(s) when the pool grows past ``max_size``.
        """
        source = Path(source_dir)
        if not source.is_dir():
            raise ValueError(f"cannot add simulator snapshot: {source} does not exist or is not a directory (save the adapter there first)")
        if not any(p.is_file() for p in source.rglob("*")):
            raise ValueError(f"cannot add simulator snapshot: {source} contains no files (did save_pretrained run?)")
        is_base = self._next_index == 0
        if base and not is_base:
            raise ValueError(
                f"base=True but the pool at {self.root} already had {self._next_index} member(s) added; only the first member is the base"
            )

        member_id = f"m{self._next_index:04d}-step{step}"
        final = self.root / MEMBERS_DIR / member_id
        # A directory with this id but no manifest entry is the leftover of an interrupted add.
        _remove_tree(final)
        # Copied under a temporary name and renamed: a member directory is complete or absent.
        with files.atomic_directory(final) as tmp:
            shutil.copytree(source, tmp, symlinks=False, dirs_exist_ok=True)
            content_hash = directory_hash(tmp)
        _make_read_only(final)

        member = PoolMember(
            member_id=member_id,
            step=step,
            path=str(final),
            content_hash=content_hash,
            pinned=is_base and self.pin_base,
            created=time.time(),
        )
        self._members.append(member)
        self._next_index += 1
        evicted = self._evict()
        # Manifest first, then delete: a crash in between leaves an orphan directory, never a
        # manifest entry that points at nothing.
        self._save()
        for old in evicted:
            _remove_tree(Path(old.path))
        return member

    def rewind(self, step: int) -> list[str]:
        """Drop the members added after training ``step`` and give their numbers back, so a run resumed
        from that step's checkpoint adds them again under the same ids; returns the dropped ids. Members
        those later adds evicted are gone for good (their directories were deleted)."""
        later = [m for m in self._members if m.step > step]
        if not later:
            return []
        self._members = [m for m in self._members if m.step <= step]
        self._next_index -= len(later)
        self._save()
        for member in later:
            _remove_tree(Path(member.path))
        return [m.member_id for m in later]

    def _evict(self) -> list[PoolMember]:
        """FIFO: drop the oldest unpinned members until the pool fits. Returns them."""
        evicted = []
        while len(self._members) > self.max_size:
            oldest = next(m for m in self._members if not m.pinned)  # exists: validated max_size >= 2 when pinning
            self._members.remove(oldest)
            evicted.append(oldest)
        return evicted

    # ---------------------------------------------------------------- selection

    def select(self, rng: random.Random | None = None, scores: dict[str, float] | None = None) -> PoolMember:
        """The member that plays the user for the next rollout group.

        With ``rng=None`` the pool's own ``random.Random(seed)`` is used and its state saved to the
        manifest, so the sequence continues across :meth:`load`. A caller-supplied ``rng`` leaves
        the pool's state untouched. ``scores`` is only used by ``prioritized``.
        """
        if not self._members:
            raise PoolError(f"the pool at {self.root} is empty: add the base simulator before selecting")
        if self.selection == "latest":
            return self._members[-1]
        use_internal = rng is None
        rng = self._rng if rng is None else rng
        if self.selection == "random":
            chosen = self._members[rng.randrange(len(self._members))]
        else:
            weights = self.priority_weights(scores)
            chosen = rng.choices(self._members, weights=[weights[m.member_id] for m in self._members])[0]
        if use_internal:
            self._selections += 1
            # No fsync: selection happens once per rollout group and only the RNG state changed.
            self._save(durable=False)
        return chosen

    def priority_weights(self, scores: dict[str, float] | None = None) -> dict[str, float]:
        """Relative selection weights for ``prioritized``: harder opponents are picked more often.

        ``scores[member_id]`` is the agent's recent mean reward against that member (higher = the
        agent does better). Over the current members that have a score:

            norm_i   = (s_i - min s) / (max s - min s)      (0 when all scores are equal)
            weight_i = floor + (1 - floor) * (1 - norm_i)

        so the member the agent does worst against gets weight 1, the one it does best against
        gets ``floor`` (``priority_floor``), i.e. every member keeps at least ``floor`` of the
        hardest member's weight and stays in play. Members without a score (new snapshots) get
        the maximum weight 1. Scores for ids not in the pool (evicted members) are ignored.
        """
        scores = scores or {}
        known = {m.member_id for m in self._members}
        scored = {k: float(v) for k, v in scores.items() if k in known}
        for member_id, value in scored.items():
            if not math.isfinite(value):
                raise ValueError(f"score for {member_id!r} is {value}; leave a member out of scores when it has no finite reward yet")
        floor = self.priority_floor
        low = min(scored.values(), default=0.0)
        span = max(scored.values(), default=0.0) - low
        weights = {}
        for member in self._members:
            if member.member_id not in scored:
                weights[member.member_id] = 1.0
                continue
            norm = (scored[member.member_id] - low) / span if span > 0 else 0.0
            weights[member.member_id] = floor + (1.0 - floor) * (1.0 - norm)
        return weights

    # ---------------------------------------------------------------- integrity

    def verify(self) -> None:
        """Recompute every member's content hash; raise :class:`PoolIntegrityError` listing every
        member whose directory is missing or whose content changed."""
        problems = []
        for member in self._members:
            path = Path(member.path)
            if not path.is_dir():
                problems.append(f"{member.member_id}: directory {path} is missing")
            elif (actual := directory_hash(path)) != member.content_hash:
                problems.append(
                    f"{member.member_id}: content changed on disk (hash {actual[:12]}..., recorded {member.content_hash[:12]}...)"
                )
        if problems:
            raise PoolIntegrityError(
                f"simulator pool at {self.root} failed verification; members must never change after add():\n  " + "\n  ".join(problems)
            )

    # ----------------------------------------------------------------- manifest

    @property
    def manifest_path(self) -> Path:
        return self.root / MANIFEST_NAME

    @staticmethod
    def exists(root: str | os.PathLike[str]) -> bool:
        """Whether ``root`` holds a pool (its manifest)."""
        return (Path(root) / MANIFEST_NAME).exists()

    def _save(self, durable: bool = True) -> None:
        version, internal, gauss_next = self._rng.getstate()
        manifest = _Manifest(
            version=MANIFEST_VERSION,
            settings=_Settings(
                max_size=self.max_size, pin_base=self.pin_base, selection=self.selection, priority_floor=self.priority_floor, seed=self.seed
            ),
            next_index=self._next_index,
            selections=self._selections,
            rng_state=[version, list(internal), gauss_next],
            members=[m.model_copy(update={"path": Path(m.path).relative_to(self.root).as_posix()}) for m in self._members],
        )
        files.write_json(self.manifest_path, manifest.model_dump(mode="json"), durable=durable)

    @classmethod
    def load(cls, root: str | os.PathLike[str], verify: bool = True) -> SimulatorPool:
        """Reopen the pool saved at ``root``: same settings, members, hashes and selection state.
        With ``verify`` (the default) every member's hash is checked before returning."""
        root = Path(root)
        path = root / MANIFEST_NAME
        if not path.is_file():
            raise PoolManifestError(
                f"no pool manifest at {path}: check the pool root, or create a new pool with "
                f"SimulatorPool({str(root)!r}, ...) and add the base simulator"
            )
        fix = (
            f"restore {path} from a backup, or move {root} aside and build a new pool "
            f"(the member directories under {root / MEMBERS_DIR} can be re-added)"
        )
        try:
            manifest = _Manifest.model_validate(json.loads(path.read_text(encoding="utf-8")))
            if manifest.version != MANIFEST_VERSION:
                raise ValueError(f"manifest version {manifest.version}, this code reads version {MANIFEST_VERSION}")
            _validated_settings(**manifest.settings.model_dump())
            rng = random.Random()
            version, internal, gauss_next = manifest.rng_state
            rng.setstate((version, tuple(internal), gauss_next))
        except (json.JSONDecodeError, UnicodeDecodeError, ValidationError, ValueError, TypeError) as exc:
            raise PoolManifestError(f"corrupt pool manifest {path}: {exc}\nTo fix: {fix}") from exc

        resolved_root = root.resolve()
        members = []
        for member in manifest.members:
            resolved = (resolved_root / member.path).resolve()
            if resolved.parent != resolved_root / MEMBERS_DIR:
                raise PoolManifestError(
                    f"corrupt pool manifest {path}: member {member.member_id} points outside {root / MEMBERS_DIR}: {member.path}\nTo fix: {fix}"
                )
            members.append(member.model_copy(update={"path": str(resolved)}))
        if len({m.member_id for m in members}) != len(members):
            raise PoolManifestError(f"corrupt pool manifest {path}: duplicate member ids\nTo fix: {fix}")

        pool = cls.__new__(cls)
        pool._setup(root, manifest.settings, manifest.next_index, manifest.selections, rng, members)
        if verify:
            pool.verify()
        return pool

    def __repr__(self) -> str:
        return f"SimulatorPool(root={str(self.root)!r}, size={len(self)}/{self.max_size}, selection={self.selection!r})"


def _validated_settings(**kwargs: Any) -> _Settings:
    try:
        settings = _Settings(**kwargs)
    except ValidationError as exc:
        raise ValueError(f"invalid simulator pool settings: {exc}") from exc
    if settings.pin_base and settings.max_size < 2:
        # With the base pinned, a size-1 pool would evict every new snapshot on arrival.
        raise ValueError("max_size must be at least 2 when pin_base=True (the pinned base takes one slot)")
    return settings
