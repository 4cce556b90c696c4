"""The training loop on a tiny saved model: roles, co-training, population, evaluation, exact resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from scope_marl.config import TrainConfig
from scope_marl.experiment import resume, start


def config(model_dir, **overrides) -> dict:
    base = {
        "model": f"hf:{model_dir}",
        "env": {"name": "say_the_word", "num_tasks": 8, "max_exchanges": 2},
        "agent_sampling": {"temperature": 1.0, "max_new_tokens": 6},
        "simulator": {"mode": "frozen", "model": f"hf:{model_dir}", "sampling": {"temperature": 1.0, "max_new_tokens": 6}},
        "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "learner": {"lr": 0.01, "kl_coef": 0.01},
        "rollout": {"group_size": 2, "max_concurrent": 16, "on_turn_limit": "continue", "progress": False},
        "tasks_per_step": 2,
        "steps": 4,
        "checkpoint_every": 2,
        "eval": {
            "every": 2,
            "tasks": 2,
            "simulator": {
                "mode": "frozen",
                "id": "heldout",
                "model": f"hf:{model_dir}",
                "sampling": {"temperature": 1.3, "max_new_tokens": 6},
            },
        },
        "seed": 0,
        "threads": 1,
        "deterministic": True,
    }
    base.update(overrides)
    return base


def comparable(record: dict) -> dict:
    """A metrics line without wall-clock fields."""
    drop = {"rollout_s", "update_s"}
    out = {k: v for k, v in record.items() if k not in drop}
    for key in [k for k in out if k.startswith("train_")]:
        out[key] = {k: v for k, v in out[key].items() if k != "update_s"}
    return out


def test_agent_only_training_leaves_the_simulator_alone_and_writes_metrics(tiny_model_dir, tmp_path):
    cfg = config(tiny_model_dir, checkpoint_every=1, eval={**config(tiny_model_dir)["eval"], "every": 1})
    trainer = start(TrainConfig.model_validate(cfg), tmp_path / "run")
    records = trainer.run(progress=False)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    first = records[0]["train_agent"]
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and first["clip_fraction"] == 0.0
    assert "train_user" not in records[0] and records[1]["eval"]["heldout"]["simulators"] == ["heldout"]
    assert (tmp_path / "run" / "checkpoints" / "step-000004").exists()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[-1])["step"] == 4
    kept = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    best_step = int(trainer.best[1].rsplit("-", 1)[1])
    assert trainer.best[0] == max(r["eval"]["reward_agent"] for r in records if "eval" in r)
    assert kept == sorted({"step-000003", "step-000004", f"step-{best_step:06d}"}), "the last 2 and the best"
    assert trainer.cursor == 8, "4 steps x 2 tasks read from the training cursor; evaluation read none"


def test_co_training_updates_both_adapters_and_simulator_only_freezes_the_agent(tiny_model_dir, tmp_path):
    sim = {"mode": "trainable", "model": f"hf:{tiny_model_dir}", "sampling": {"temperature": 1.0, "max_new_tokens": 6}}
    both = start(
        TrainConfig.model_validate(config(tiny_model_dir, simulator=sim, trainable_roles=["agent", "user"], steps=1)), tmp_path / "both"
    )
    record = both.train_step()
    assert record["train_agent"]["episodes"] > 0 and record["train_user"]["episodes"] > 0
    only_user = start(
        TrainConfig.model_validate(config(tiny_model_dir, simulator=sim, trainable_roles=["user"], steps=1)), tmp_path / "user"
    )
    agent_before = {n: p.clone() for n, p in only_user.chat.model.named_parameters() if ".agent." in n}
    only_user.train_step()
    assert all(torch.equal(p, agent_before[n]) for n, p in only_user.chat.model.named_parameters() if ".agent." in n)


@pytest.mark.integration
def test_population_snapshots_go_to_the_pool(tiny_model_dir, tmp_path):
    sim = {"mode": "trainable", "model": f"hf:{tiny_model_dir}", "sampling": {"temperature": 1.0, "max_new_tokens": 6}}
    # The tiny model's rewards are constant (zero advantages); an entropy bonus still moves the simulator.
    cfg = config(
        tiny_model_dir,
        simulator=sim,
        trainable_roles=["agent", "user"],
        steps=4,
        pool={"every": 2, "max_size": 3},
        simulator_learner={"lr": 0.01, "entropy_coef": 0.01},
    )
    trainer = start(TrainConfig.model_validate(cfg), tmp_path / "pop")
    trainer.run(progress=False)
    members = trainer.population.pool.members
    assert [m.step for m in members] == [0, 2, 4] and members[0].pinned
    assert len({m.path for m in members}) == 3 and len({m.content_hash for m in members}) == 3
    lines = [json.loads(line) for line in (tmp_path / "pop" / "metrics.jsonl").read_text().splitlines()]
    played = [line["pool_member"] for line in lines]
    assert played[0] == members[0].member_id and set(played) <= {m.member_id for m in members}
    assert set(trainer.population.member_rewards) == set(played), (
        "the agent's reward against each played member is kept for prioritized selection"
    )


def test_config_rejects_inconsistent_roles(tiny_model_dir):
    with pytest.raises(ValueError, match="mode: trainable"):
        TrainConfig.model_validate(config(tiny_model_dir, trainable_roles=["agent", "user"]))


def train_until_killed(cli: list[str], cfg_path: Path, out: Path, env: dict, step: int = 2, before_kill=None) -> None:
    """Start ``scope train`` into ``out`` and SIGKILL it as soon as its checkpoint of ``step`` is whole
    (``before_kill(pid)`` first, when given)."""
    killed = subprocess.Popen([*cli, str(cfg_path), "--out", str(out)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoint = out / "checkpoints" / f"step-{step:06d}" / "state.json"
    deadline = time.time() + 240
    while not checkpoint.exists() and killed.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert checkpoint.exists(), "the run never wrote its first checkpoint"
    if before_kill is not None:
        before_kill(killed.pid)
    killed.send_signal(signal.SIGKILL)
    killed.wait()


@pytest.mark.integration
def test_exact_resume_after_sigkill(tiny_model_dir, tmp_path):
    cfg_path = tmp_path / "train.yaml"
    cfg_path.write_text(yaml.safe_dump(config(tiny_model_dir, steps=4, checkpoint_every=2)))
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    cli = [sys.executable, "-m", "scope_marl.cli", "train"]

    subprocess.run([*cli, str(cfg_path), "--out", str(tmp_path / "straight")], check=True, env=env, capture_output=True)

    train_until_killed(cli, cfg_path, tmp_path / "killed", env)
    subprocess.run([*cli, "--resume", str(tmp_path / "killed")], check=True, env=env, capture_output=True)

    def read(run):
        return [comparable(json.loads(line)) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]

    straight, resumed = read("straight"), read("killed")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    assert resumed == straight


def test_resume_needs_a_run_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.yaml"):
        resume(tmp_path)


def test_a_second_demo_never_overwrites_the_first(tmp_path):
    from scope_marl.demo import fresh_dir

    out = tmp_path / "demo"
    assert fresh_dir(out) == out
    out.mkdir()
    assert fresh_dir(out) == out, "an empty folder is free"
    (out / "report.md").write_text("first")
    assert fresh_dir(out) == tmp_path / "demo-2"
    (tmp_path / "demo-2").mkdir()
    (tmp_path / "demo-2" / "report.md").write_text("second")
    assert fresh_dir(out) == tmp_path / "demo-3"


@pytest.mark.integration
def test_full_fine_tuning_trains_a_copy_and_keeps_the_base_as_reference(tiny_model_dir, tmp_path):
    cfg = config(
        tiny_model_dir,
        finetune="full",
        steps=2,
        checkpoint_every=1,
        learner={"lr": 1e-3, "kl_coef": 0.01},
        eval={**config(tiny_model_dir)["eval"], "every": 0},
    )
    trainer = start(TrainConfig.model_validate(cfg), tmp_path / "full")
    assert trainer.agent_chat is not trainer.chat and not trainer.agent_chat.adapters
    base_before = {k: v.clone() for k, v in trainer.chat.model.state_dict().items()}
    agent_before = {k: v.clone() for k, v in trainer.agent_chat.model.state_dict().items()}
    first = trainer.train_step()["train_agent"]
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and first["clip_fraction"] == 0.0
    assert first["kl"] == pytest.approx(0.0, abs=1e-6), "before the first update the copy equals its reference"
    trainer.run(progress=False)
    assert all(torch.equal(v, base_before[k]) for k, v in trainer.chat.model.state_dict().items()), "the reference never moves"
    moved = [k for k, v in trainer.agent_chat.model.state_dict().items() if not torch.equal(v, agent_before[k])]
    assert len(moved) > 10, "full fine-tuning updates weights throughout the model, not a few adapter matrices"

    latest = tmp_path / "full" / "checkpoints" / "step-000002"
    assert (latest / "weights" / "agent.safetensors").exists() and not (latest / "adapters").exists()
    resumed = resume(tmp_path / "full")
    assert all(torch.equal(v, trainer.agent_chat.model.state_dict()[k]) for k, v in resumed.agent_chat.model.state_dict().items())

    from scope_marl.evaluation.evaluate import load_agent

    evaluated = load_agent(str(tmp_path / "full"))  # scope eval on a fully fine-tuned run
    assert evaluated.adapter is None and evaluated.chat is not evaluated.models.get(f"hf:{tiny_model_dir}")
    assert all(torch.equal(v, trainer.agent_chat.model.state_dict()[k]) for k, v in evaluated.chat.model.state_dict().items())


def test_full_fine_tuning_is_agent_only(tiny_model_dir):
    sim = {"mode": "trainable", "model": f"hf:{tiny_model_dir}"}
    with pytest.raises(ValueError, match="finetune: full trains the agent only"):
        TrainConfig.model_validate(config(tiny_model_dir, finetune="full", simulator=sim, trainable_roles=["agent", "user"]))


@pytest.mark.integration
def test_tensorboard_mirrors_the_metrics_lines(tiny_model_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = start(TrainConfig.model_validate(config(tiny_model_dir, steps=2, checkpoint_every=1, tensorboard=True)), tmp_path / "tb")
    records = trainer.run(progress=False)
    events = EventAccumulator(str(tmp_path / "tb" / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"reward_agent/mean", "train_agent/kl", "train_agent/entropy", "rollout_s"} <= tags
    kl = [(e.step, e.value) for e in events.Scalars("train_agent/kl")]
    assert kl == [(r["step"], pytest.approx(r["train_agent"]["kl"], rel=1e-6, abs=1e-9)) for r in records]

    # A resume from step 1's checkpoint replays step 2: TensorBoard keeps one point per step, not two.
    import shutil

    shutil.rmtree(tmp_path / "tb" / "checkpoints" / "step-000002")
    resumed = resume(tmp_path / "tb")
    assert resumed.step == 1
    resumed.run(progress=False)
    events = EventAccumulator(str(tmp_path / "tb" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("train_agent/kl")] == [1, 2]


def test_a_bad_eval_panel_fails_when_training_starts(tiny_model_dir, tmp_path):
    from scope_marl.config import ConfigError

    cfg = config(tiny_model_dir, eval={"every": 1, "panel": "no-such-panel"})
    with pytest.raises(ConfigError, match="neither a file nor a built-in panel; built-in: api, coop-offline, offline"):
        start(TrainConfig.model_validate(cfg), tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_an_eval_panel_whose_env_overrides_do_not_fit_the_run_fails_at_start(tiny_model_dir, tmp_path):
    from scope_marl.config import ConfigError

    # The offline panel's busy-hot entry overrides the P4G field `source`; this run plays say_the_word.
    cfg = config(tiny_model_dir, eval={"every": 1, "panel": "offline"})
    with pytest.raises(ConfigError, match=r"does not fit this run's env \(say_the_word\)[\s\S]*simulators\.3\.env: .*\['source'\]"):
        start(TrainConfig.model_validate(cfg), tmp_path / "run")


@pytest.mark.integration
def test_torchrun_trains_one_run_on_two_data_parallel_ranks_and_resumes_exactly(tiny_model_dir, tmp_path):
    """`torchrun --nproc-per-node 2 -m scope_marl.cli train`: two gloo ranks each play half the groups and
    train on half, rank 0 writes the run. Population co-training (pool barriers) and evaluation (rank 0)
    included. Against one process: the same episode ids, groups and pool members, and most episodes equal
    token for token (a rank's batch has another shape, which can flip a draw on the tiny model's flat
    distributions). A resume under torchrun from step 1 plays step 2 again exactly as the ranks first did."""
    import shutil
    import socket

    from scope_marl.core import run_layout
    from scope_marl.simulators.pool import SimulatorPool

    sim = {"mode": "trainable", "model": f"hf:{tiny_model_dir}", "sampling": {"temperature": 1.0, "max_new_tokens": 6}}
    cfg = config(
        tiny_model_dir,
        simulator=sim,
        trainable_roles=["agent", "user"],
        pool={"every": 1, "max_size": 3, "selection": "latest"},
        learner={"lr": 0.01, "entropy_coef": 0.01},
        steps=2,
        checkpoint_every=1,
        tasks_per_step=4,
    )
    cfg_path = tmp_path / "train.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}

    def torchrun(*args):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
        done = subprocess.run(
            [*launcher, "--master-port", str(port), "-m", "scope_marl.cli", "train", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    torchrun(str(cfg_path), "--out", str(tmp_path / "dp"))
    start(TrainConfig.model_validate(cfg), tmp_path / "single").run(progress=False)

    def read(run):
        episodes = [json.loads(line) for p in sorted((tmp_path / run / "rollouts").glob("*.jsonl")) for line in p.open()]
        metrics = [comparable(json.loads(line)) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in e.items() if k != "timings"} for e in episodes], metrics

    (dp_eps, dp_metrics), (one_eps, one_metrics) = read("dp"), read("single")
    key = lambda es: [(e["episode_id"], e["group_id"], e["simulator_id"]) for e in es]
    assert len(dp_eps) == 2 * 4 * 2 and key(dp_eps) == key(one_eps)
    tokens = lambda e: ([m["content"] for m in e["messages"]], {r: s["response_ids"] for r, s in e["streams"].items()})
    same = sum(tokens(a) == tokens(b) for a, b in zip(dp_eps, one_eps))  # log-probs differ in the last bits
    assert same >= len(dp_eps) // 2, f"only {same} of {len(dp_eps)} episodes equal the single process's"
    assert [m["step"] for m in dp_metrics] == [1, 2] and "eval" in dp_metrics[1]
    assert [m["pool_member"] for m in dp_metrics] == [m["pool_member"] for m in one_metrics] == ["m0000-step0", "m0001-step1"]
    for m, step_eps in zip(dp_metrics, (dp_eps[:8], dp_eps[8:])):
        for role in ("agent", "user"):
            assert m[f"train_{role}"]["episodes"] == 8, "every rank's metrics are the whole batch's"
            assert m[f"train_{role}"]["trained_tokens"] == sum(sum(e["streams"][role]["loss_mask"]) for e in step_eps)
    assert [m.step for m in SimulatorPool.load(tmp_path / "dp" / "pool").members] == [0, 1, 2]
    assert not (tmp_path / "dp" / "tensorboard").exists() and not list((tmp_path / "dp").glob("*.lock.*"))

    shutil.rmtree(run_layout.checkpoint_dir(tmp_path / "dp", 2))
    torchrun("--resume", str(tmp_path / "dp"))
    assert read("dp") == (dp_eps, dp_metrics)


def test_config_edited_before_resume_is_applied_field_by_field_or_refused(tiny_model_dir, tmp_path):
    """config.yaml edited between a stop and --resume: the learning rate (changeable) is applied to the
    restored optimizer and recorded in the next step's metrics; the LoRA rank (not changeable) is an
    error naming the field, before any model is built, and nothing in the run is touched."""
    import yaml

    from scope_marl.training.config_edits import ConfigEditRefused

    run = tmp_path / "run"
    cfg = config(tiny_model_dir, steps=1, checkpoint_every=1, eval={"every": 0})
    start(TrainConfig.model_validate(cfg), run).run(progress=False)
    saved = yaml.safe_load((run / "config.yaml").read_text())

    edited = {**saved, "lora": {**saved["lora"], "r": 8}}
    (run / "config.yaml").write_text(yaml.safe_dump(edited))
    with pytest.raises(ConfigEditRefused, match=r"lora\.r: 4 -> 8.*Put them back, or start a new run"):
        resume(run)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000001"]  # nothing set aside

    edited = {**saved, "steps": 2, "learner": {**saved["learner"], "lr": 0.5}}
    (run / "config.yaml").write_text(yaml.safe_dump(edited))
    said = []
    trainer = resume(run, said.append)
    assert all(g["lr"] == 0.5 for g in trainer.learners["agent"].optimizer.param_groups)
    assert any("learner.lr 0.01 -> 0.5" in line for line in said)
    trainer.run(progress=False)
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2]
    assert lines[1]["config_edits"] == {"learner.lr": [0.01, 0.5], "steps": [1, 2]} and "config_edits" not in lines[0]
    state = json.loads((run / "checkpoints" / "step-000002" / "state.json").read_text())
    assert state["config"]["learner"]["lr"] == 0.5  # the next resume compares against what step 2 ran with
