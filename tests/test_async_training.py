"""trainer.mode: async: a generator process plays ahead of the learners, with bounded staleness.

k = 0 is the synchronous loop run in two processes (same episodes, same updates); with k > 0 no batch
is trained more than k versions after the weights that played it; a resumed async run trains no
episode twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_trainer import comparable, config

from scope_marl.config import TrainConfig
from scope_marl.experiment import resume, start


def async_config(model_dir, k: int, **overrides) -> dict:
    return config(model_dir, trainer={"mode": "async", "max_staleness": k}, **overrides)


def episodes_of(run_dir) -> list[dict]:
    return [json.loads(line) for path in sorted((run_dir / "rollouts").glob("*.jsonl")) for line in path.read_text().splitlines()]


def same_learning(record: dict) -> dict:
    out = comparable(record)
    out.pop("async", None)
    for key in [k for k in out if k.startswith("train_")]:
        out[key] = {k: v for k, v in out[key].items() if k != "staleness_mean"}
    return out


def assert_trained_alike(records: list[dict], reference: list[dict], roles=("train_agent",)) -> None:
    """Step for step: each role's loss within 1e-6 and every other learning figure equal."""
    for a, b in zip(records, reference, strict=True):
        for role in roles:
            assert a[role]["loss"] == pytest.approx(b[role]["loss"], abs=1e-6)
        assert same_learning(a) == same_learning(b)


@pytest.mark.integration
def test_async_with_staleness_zero_trains_on_exactly_the_sync_batches(tiny_model_dir, tmp_path):
    sync = start(TrainConfig.model_validate(config(tiny_model_dir, steps=3, eval={"every": 0})), tmp_path / "sync").run(progress=False)
    trainer = start(TrainConfig.model_validate(async_config(tiny_model_dir, 0, steps=3, eval={"every": 0})), tmp_path / "async")
    assert "generator process" in trainer.executor.describe()
    played = trainer.run(progress=False)
    for a, b in zip(played, sync, strict=True):
        assert a["train_agent"]["loss"] == pytest.approx(b["train_agent"]["loss"], abs=1e-6)
        assert same_learning(a) == same_learning(b)
        assert a["train_agent"]["staleness_mean"] == 0.0 and a["async"]["in_flight"] == 0
    strip = lambda e: {k: v for k, v in e.items() if k not in ("metadata", "timings")}  # clocks differ
    assert [strip(e) for e in episodes_of(tmp_path / "async")] == [strip(e) for e in episodes_of(tmp_path / "sync")]


@pytest.mark.integration
def test_no_batch_is_trained_beyond_k_versions_and_a_resume_trains_no_episode_twice(tiny_model_dir, tmp_path):
    k = 2
    cfg = TrainConfig.model_validate(async_config(tiny_model_dir, k, steps=5, checkpoint_every=2, eval={"every": 0}))
    records = start(cfg, tmp_path / "run").run(progress=False)
    lags = []
    for record in records:
        lag = record["train_agent"]["staleness_mean"]
        assert 0 <= lag <= k
        lags.append(lag)
    assert max(lags) > 0, "the generator never ran ahead"
    for e in episodes_of(tmp_path / "run"):
        assert e["metadata"]["versions"]["agent"] >= 0
    # Resume from the step-4 checkpoint as if the run had been killed there: the batch in flight then is played again.
    run = tmp_path / "run"
    (run / "checkpoints" / "step-000005").rename(run / "set-aside")
    said = []
    trainer = resume(run, log=said.append)
    assert trainer.step == 4 and any("1 batch(es) the generator had played ahead" in m for m in said)
    trainer.run(progress=False)
    ids = [e["episode_id"] for e in episodes_of(run)]
    assert len(ids) == len(set(ids)) == 5 * cfg.tasks_per_step * cfg.rollout.group_size
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5]


def test_async_refuses_what_it_does_not_support_yet(tiny_model_dir):
    with pytest.raises(ValueError, match="finetune: full"):
        TrainConfig.model_validate(async_config(tiny_model_dir, 1, finetune="full"))
    assert TrainConfig.model_validate(async_config(tiny_model_dir, 1, executor="ray")).trainer.mode == "async"
    assert TrainConfig.model_validate(async_config(tiny_model_dir, 1, **pool_run(tiny_model_dir))).pool is not None


def pool_run(model_dir, **pool) -> dict:
    """Population co-training on the tiny model: an entropy bonus moves the simulator (its rewards are constant)."""
    sim = {"mode": "trainable", "model": f"hf:{model_dir}", "sampling": {"temperature": 1.0, "max_new_tokens": 6}}
    return {
        "simulator": sim,
        "trainable_roles": ["agent", "user"],
        "simulator_learner": {"lr": 0.01, "entropy_coef": 0.01},
        "pool": {"every": 1, "max_size": 3, "selection": "random", **pool},
        "eval": {"every": 0},
    }


@pytest.mark.integration
def test_an_async_pool_run_with_staleness_zero_trains_as_the_sync_pool_run(tiny_model_dir, tmp_path):
    """Each batch carries the member drawn for it and the simulator learner loads that member when it
    trains on the batch: with k = 0 that is the synchronous population step (same members, episodes, losses)."""
    pool = pool_run(tiny_model_dir, selection="latest")  # a new member each step
    sync = start(TrainConfig.model_validate(config(tiny_model_dir, steps=4, **pool)), tmp_path / "sync")
    sync_records = sync.run(progress=False)
    played = start(TrainConfig.model_validate(async_config(tiny_model_dir, 0, steps=4, **pool)), tmp_path / "async")
    records = played.run(progress=False)
    assert [r["pool_member"] for r in records] == [r["pool_member"] for r in sync_records]
    assert len({r["pool_member"] for r in records}) > 1, "more than one member played"
    assert_trained_alike(records, sync_records, roles=("train_agent", "train_user"))
    strip = lambda e: {k: v for k, v in e.items() if k not in ("metadata", "timings")}
    assert [strip(e) for e in episodes_of(tmp_path / "async")] == [strip(e) for e in episodes_of(tmp_path / "sync")]
    hashes = lambda t: [m.content_hash for m in t.population.pool.members]
    assert hashes(played) == hashes(sync)  # the simulator trained the same way, snapshot for snapshot


@pytest.mark.integration
def test_an_async_pool_run_that_trains_only_the_simulator_advances_its_versions(tiny_model_dir, tmp_path):
    """Nothing that plays changes (members carry their own weights, the agent is frozen), yet each
    update's version still goes out: without it the next batch would wait for it forever."""
    overrides = {**pool_run(tiny_model_dir), "trainable_roles": ["user"], "steps": 3}
    records = start(TrainConfig.model_validate(async_config(tiny_model_dir, 1, **overrides)), tmp_path / "run").run(progress=False)
    assert [r["step"] for r in records] == [1, 2, 3] and all(r["train_user"]["staleness_mean"] == 0 for r in records)


@pytest.mark.integration
def test_a_resumed_async_pool_run_rewinds_the_pool_and_trains_no_episode_twice(tiny_model_dir, tmp_path):
    """Resume an async pool run from its step-2 checkpoint as if it had been killed after step 3: the
    snapshots of step 3 leave the pool, the batches in flight are drawn and played again, and no
    episode or step is trained twice."""
    cfg = TrainConfig.model_validate(
        async_config(tiny_model_dir, 1, steps=3, checkpoint_every=2, **pool_run(tiny_model_dir, selection="latest"))
    )
    start(cfg, tmp_path / "run").run(progress=False)
    run = tmp_path / "run"
    (run / "checkpoints" / "step-000003").rename(run / "set-aside")
    said = []
    trainer = resume(run, log=said.append)
    assert trainer.step == 2 and any("m0003-step3" in m for m in said), said  # the pool is back to what step 2 knew
    records = trainer.run(progress=False)
    assert records[0]["pool_member"] == "m0002-step2" and records[0]["train_user"]["staleness_mean"] == 0
    ids = [e["episode_id"] for e in episodes_of(run)]
    assert len(ids) == len(set(ids)) == 3 * cfg.tasks_per_step * cfg.rollout.group_size
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    members = [m.member_id for m in trainer.population.pool.members]
    assert members[0] == "m0000-step0" and members[-1] == "m0003-step3"  # the base kept, step 3's snapshot taken again


@pytest.mark.integration
def test_an_async_pool_run_plays_each_batch_with_its_member_even_one_evicted_meanwhile(tiny_model_dir, tmp_path):
    """k = 2 with a pool of 2 snapshotted every step: members are evicted (deleted) while batches drawn
    with them are still queued, and each batch still plays the member it was drawn with."""
    cfg = TrainConfig.model_validate(async_config(tiny_model_dir, 2, steps=6, **pool_run(tiny_model_dir, max_size=2)))
    trainer = start(cfg, tmp_path / "run")
    records = trainer.run(progress=False)
    batches = [
        [json.loads(line) for line in path.read_text().splitlines()] for path in sorted((tmp_path / "run" / "rollouts").glob("*.jsonl"))
    ]
    for record, episodes in zip(records, batches, strict=True):
        assert {e["simulator_id"] for e in episodes} == {f"trainable:{record['pool_member']}"}
        assert record["train_user"]["staleness_mean"] == 0  # the learner starts from the member that played
        assert 0 <= record["train_agent"]["staleness_mean"] <= 2
    assert max(r["train_agent"]["staleness_mean"] for r in records) > 0, "batches were played ahead"
    # Member m_j (snapshot of step j) is evicted by the snapshot of step j + 1; batch t trained with m_j, j <= t - 2, j > 0
    # was drawn before that eviction and trained (its member loaded by the learner) after it.
    snapshot_step = lambda member: int(member.rsplit("step", 1)[1])
    evicted = [r["step"] for r in records if 0 < snapshot_step(r["pool_member"]) <= r["step"] - 2]
    assert evicted, f"no batch outlived its member in the pool: {[r['pool_member'] for r in records]}"


@pytest.mark.integration
def test_sigkill_during_an_async_run_resumes_with_every_step_once_and_leaves_no_generator(tiny_model_dir, tmp_path):
    import os
    import subprocess
    import sys
    import time

    import yaml
    from test_trainer import train_until_killed

    cfg_path = tmp_path / "train.yaml"
    cfg_path.write_text(yaml.safe_dump(async_config(tiny_model_dir, 1, steps=4, checkpoint_every=2)))
    cli = [sys.executable, "-m", "scope_marl.cli", "train"]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    children: list[int] = []

    def before_kill(pid: int) -> None:
        for task in Path(f"/proc/{pid}/task").iterdir():
            children.extend(int(c) for c in (task / "children").read_text().split())

    train_until_killed(cli, cfg_path, tmp_path / "run", env, before_kill=before_kill)
    assert children, "the trainer had no generator process"
    deadline = time.time() + 30
    while any(Path(f"/proc/{c}").exists() for c in children) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(Path(f"/proc/{c}").exists() for c in children), "the generator outlived its killed trainer"
    done = subprocess.run([*cli, "--resume", str(tmp_path / "run")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    ids = [e["episode_id"] for e in episodes_of(tmp_path / "run")]
    assert len(ids) == len(set(ids)) == 4 * 2 * 2  # steps x tasks_per_step x group_size, none twice
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


@pytest.mark.integration
def test_episodes_of_very_different_lengths_are_trained_as_in_the_sync_run(talky_model_dir, tmp_path):
    """Admission control trains every played episode, oldest batch first: async (k = 2) trains at each
    step the groups the sync run trains then, slow long episodes included, and the trained lengths
    have sync's distribution (a loop that dropped stale episodes would lose the long ones)."""
    import numpy as np

    sampling = {"temperature": 1.0, "max_new_tokens": 32}
    overrides = {
        "steps": 4,
        "tasks_per_step": 4,
        "eval": {"every": 0},
        "agent_sampling": sampling,
        "simulator": {"mode": "frozen", "model": f"hf:{talky_model_dir}", "sampling": sampling},
        "rollout": {"group_size": 4, "max_concurrent": 16, "on_turn_limit": "continue", "progress": False},
    }
    start(TrainConfig.model_validate(config(talky_model_dir, **overrides)), tmp_path / "sync").run(progress=False)
    start(TrainConfig.model_validate(async_config(talky_model_dir, 2, **overrides)), tmp_path / "async").run(progress=False)
    runs = {name: episodes_of(tmp_path / name) for name in ("sync", "async")}
    trained = {name: [(e["group_id"], e["task_id"]) for e in episodes] for name, episodes in runs.items()}
    assert trained["async"] == trained["sync"], "the same groups, in the same order, every episode of each"
    assert max(e["metadata"]["versions"]["agent"] for e in runs["async"]) < 3, "batches were played ahead"
    lengths = {
        name: np.array([sum(sum(s["loss_mask"]) for s in e["streams"].values()) for e in episodes]) for name, episodes in runs.items()
    }
    assert lengths["sync"].max() >= 4 * max(lengths["sync"].min(), 1), f"the episodes' lengths differ widely: {sorted(lengths['sync'])}"
    grid = np.union1d(lengths["sync"], lengths["async"])
    cdf = lambda x: np.searchsorted(np.sort(x), grid, side="right") / len(x)
    distance = np.abs(cdf(lengths["sync"]) - cdf(lengths["async"])).max()
    assert distance < 1.36 * np.sqrt(2 / len(lengths["sync"])), f"Kolmogorov-Smirnov distance {distance:.3f}"
