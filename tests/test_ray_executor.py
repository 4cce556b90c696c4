"""Rollouts on Ray workers (a real local Ray cluster): the same episodes as the local engine, workers
replaced mid-step without changing the batch, stale workers refusing to play, `scope rollout` on Ray."""

from __future__ import annotations

import functools
import json
import os
import signal
import threading

import pytest
import torch
import yaml

ray = pytest.importorskip("ray", reason="the ray extra is not installed; `make setup` installs it")

from scope_marl.assembly import build_rollout  # noqa: E402
from scope_marl.config import RolloutRunConfig  # noqa: E402
from scope_marl.executor import split_blocks  # noqa: E402
from scope_marl.executor.ray_workers import RayExecutor, StaleWorker  # noqa: E402

pytestmark = pytest.mark.integration  # a real local Ray cluster


@pytest.fixture(scope="module", autouse=True)
def local_cluster():
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every service on 127.0.0.1
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers' setting: the same float sums, bit for bit
    yield
    torch.set_num_threads(threads)


def tiny_config(model_dir, tasks: int = 6, tokens: int = 12, exchanges: int = 2, **rollout) -> RolloutRunConfig:
    model = f"hf:{model_dir}"
    sampling = {"temperature": 1.0, "max_new_tokens": tokens}
    return RolloutRunConfig.model_validate(
        {
            "env": {"name": "say_the_word", "num_tasks": 16, "max_exchanges": exchanges},
            "num_tasks": tasks,
            "agent": {"model": model, "sampling": sampling},
            "simulator": {"mode": "frozen", "model": model, "sampling": sampling},
            "rollout": {"group_size": 2, "seed": 3, "progress": False, "on_empty_reply": "keep", **rollout},
        }
    )


def tokens(episodes):
    return [
        (e.episode_id, e.simulator_id, [m.content for m in e.messages], {r: s.response_ids for r, s in e.streams.items()}) for e in episodes
    ]


def local_and_ray(cfg: RolloutRunConfig, workers: int):
    """The config's tasks played by the local engine, then by ``workers`` Ray workers: (local, ray, worker pids)."""
    local = build_rollout(cfg)
    tasks = local.env.tasks("train")[: cfg.num_tasks]
    expected = local.run(tasks)
    executor = RayExecutor(functools.partial(build_rollout, cfg), workers=workers)
    try:
        return expected, executor.play(tasks, first_group=0), executor.worker_pids()
    finally:
        executor.close()


def test_blocks_are_contiguous_and_balanced():
    assert split_blocks(5, 2) == [(0, 3), (3, 5)]
    assert split_blocks(1, 3) == [(0, 1), (1, 1), (1, 1)]


def test_one_worker_plays_exactly_the_local_episodes(tiny_model_dir, one_thread):
    expected, got, _ = local_and_ray(tiny_config(tiny_model_dir), workers=1)
    assert tokens(got) == tokens(expected)
    for a, b in zip(got, expected):
        for role in a.streams:
            assert a.streams[role].logprobs == b.streams[role].logprobs  # bit for bit: same code, same thread count


def test_two_workers_keep_groups_whole_and_match_the_local_run(tiny_model_dir, one_thread):
    """Each worker plays whole groups with the seeds the local engine gives them. Token for token where
    a worker's batch has the local batch's shape; otherwise padding can change logits in the last bits,
    which can flip a draw on this random model's flat distributions: the stated check is that every
    group is whole, ids, order and simulators are the local ones, and most episodes are identical."""
    expected, got, pids = local_and_ray(tiny_config(tiny_model_dir, tasks=6), workers=2)
    assert len(set(pids)) == 2
    assert [(e.episode_id, e.group_id, e.simulator_id) for e in got] == [(e.episode_id, e.group_id, e.simulator_id) for e in expected]
    same = sum(a == b for a, b in zip(tokens(got), tokens(expected)))
    assert same >= len(expected) // 2, f"only {same} of {len(expected)} episodes equal the local ones"


def test_scripted_episodes_are_equal_on_two_workers():
    cfg = RolloutRunConfig.model_validate(
        {
            "env": {"name": "say_the_word", "num_tasks": 5, "max_exchanges": 2},
            "agent": {"model": "scripted:Please say the word.", "trainable": False},
            "simulator": {"mode": "frozen", "model": "scripted:No way.", "id": "stubborn"},
            "rollout": {"group_size": 3, "progress": False},
        }
    )
    expected, got, _ = local_and_ray(cfg, workers=2)
    strip = lambda es: [e.model_dump(exclude={"timings"}) for e in es]
    assert strip(got) == strip(expected) and len(got) == 15


def test_a_worker_killed_mid_step_is_replaced_and_the_batch_is_unchanged(tiny_model_dir, one_thread):
    cfg = tiny_config(tiny_model_dir, tasks=8, tokens=24, exchanges=3, max_concurrent=1, on_turn_limit="continue")  # seconds, not ms
    factory = functools.partial(build_rollout, cfg)
    tasks = build_rollout(cfg).env.tasks("train")[:8]
    executor = RayExecutor(factory, workers=2)
    try:
        expected = executor.play(tasks, first_group=0)
        victim = executor.worker_pids()[0]
        result = {}
        runner = threading.Thread(target=lambda: result.setdefault("episodes", executor.play(tasks, first_group=0)))
        runner.start()
        threading.Event().wait(0.5)
        os.kill(victim, signal.SIGKILL)
        runner.join(timeout=120)
        assert "episodes" in result, "the step did not complete"
        assert executor.restarts == 1 and victim not in executor.worker_pids()
        assert tokens(result["episodes"]) == tokens(expected)
    finally:
        executor.close()


def test_a_stale_worker_refuses_to_play():
    cfg = RolloutRunConfig.model_validate(
        {"agent": {"model": "scripted:Say it.", "trainable": False}, "simulator": {"mode": "frozen", "model": "scripted:No."}}
    )
    executor = RayExecutor(functools.partial(build_rollout, cfg), workers=1)
    try:
        executor.send({}, version=1)
        tasks = build_rollout(cfg).env.tasks("train")[:1]
        assert len(executor.play(tasks)) == cfg.rollout.group_size
        with pytest.raises(StaleWorker, match="holds adapter version 1, asked to play version 0"):
            ray.get(executor.workers[0].play.remote(tasks, 0, 0))
        executor.version = 2  # a step whose update never reached the workers
        with pytest.raises(StaleWorker, match="asked to play version 2"):
            executor.play(tasks)
    finally:
        executor.close()


def test_scope_rollout_runs_a_config_on_ray_workers(tmp_path):
    from typer.testing import CliRunner

    from scope_marl.cli import app

    common = (
        "env: {name: say_the_word, num_tasks: 4, max_exchanges: 2}\n"
        'agent: {model: "scripted:Please say apple.", trainable: false}\n'
        'simulator: {mode: frozen, model: "scripted:Okay, apple!", id: agreeable}\n'
        "rollout: {group_size: 2, progress: false}\n"
    )
    summaries = {}
    for executor in ("local", "ray"):
        (tmp_path / f"{executor}.yaml").write_text(common + f"executor: {executor}\nray: {{workers: 2}}\n")
        result = CliRunner().invoke(app, ["rollout", str(tmp_path / f"{executor}.yaml"), "--out", str(tmp_path / executor)])
        assert result.exit_code == 0, result.output
        summaries[executor] = json.loads((tmp_path / executor / "summary.json").read_text())
    ray_run, local_run = summaries["ray"], summaries["local"]
    assert ray_run["episodes"] == 8 and ray_run["status"]["COMPLETED"] == 8 and ray_run["tasks"] == 4
    assert ray_run["simulator"]["id"] == "agreeable" and ray_run["rewards"] == local_run["rewards"]  # one task's word is apple


def adapted_engine(model_dir: str, lora_b_seed: int | None = None):
    """A tiny-model engine whose agent plays through LoRA adapter "agent" (B = 0 as created, or random
    with ``lora_b_seed``): the factory a training run's workers would use."""
    from peft import LoraConfig

    from scope_marl.backends.hf import HFChatModel
    from scope_marl.backends.seat import Seat
    from scope_marl.config import RolloutConfig
    from scope_marl.envs import SayTheWord
    from scope_marl.rollout import RolloutEngine
    from scope_marl.simulators import FrozenSimulator

    chat = HFChatModel.from_pretrained(model_dir, name="tiny")
    torch.manual_seed(0)
    chat.add_adapter("agent", LoraConfig(r=4, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]))
    if lora_b_seed is not None:
        gen = torch.Generator().manual_seed(lora_b_seed)
        with torch.no_grad():
            for name, p in chat.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=gen))
    sampling = {"temperature": 1.0, "max_new_tokens": 12}
    from scope_marl.core.types import SamplingParams

    params = SamplingParams(**sampling)
    return RolloutEngine(
        SayTheWord(num_tasks=4, max_exchanges=2),
        Seat(model=chat, sampling=params, adapter="agent", trainable=True),
        FrozenSimulator(chat, params),
        RolloutConfig(group_size=2, seed=9, progress=False, on_empty_reply="keep"),
    )


def test_pushed_adapter_tensors_change_what_workers_sample_to_the_learners_weights(tiny_model_dir, one_thread):
    from peft import get_peft_model_state_dict

    ray.cloudpickle.register_pickle_by_value(__import__(__name__))  # the factory lives in this test module
    trained = adapted_engine(str(tiny_model_dir), lora_b_seed=1)  # stands in for the learner after an update
    tasks = trained.env.tasks("train")
    expected = trained.run(tasks, first_group=0)
    tensors = {k: v.clone() for k, v in get_peft_model_state_dict(trained.agent.model.model, adapter_name="agent").items()}
    executor = RayExecutor(functools.partial(adapted_engine, str(tiny_model_dir)), workers=1)
    try:
        before = executor.play(tasks, first_group=0)  # the workers' fresh adapter (B = 0)
        assert tokens(before) != tokens(expected)
        executor.send({"agent": tensors}, version=1)
        assert tokens(executor.play(tasks, first_group=0)) == tokens(expected)
        with pytest.raises(ValueError, match="holds adapter 'critic'"):
            executor.send({"critic": tensors}, version=2)
    finally:
        executor.close()


def test_training_on_one_ray_worker_equals_local_training(tiny_model_dir, tmp_path, one_thread):
    """Population co-training (both adapters trained, a pool member loaded each step) with rollouts and
    the evaluation panel on one Ray worker: the same episodes token for token, the same metrics
    (evaluation included), adapters within 1e-6."""
    from scope_marl.config import TrainConfig
    from scope_marl.experiment import start
    from tests.test_trainer import comparable, config

    sim = {"mode": "trainable", "model": f"hf:{tiny_model_dir}", "sampling": {"temperature": 1.0, "max_new_tokens": 6}}
    runs = {}
    for executor in ("local", "ray"):
        cfg = config(
            tiny_model_dir,
            simulator=sim,
            trainable_roles=["agent", "user"],
            pool={"every": 1, "max_size": 3, "selection": "latest"},
            steps=3,
            learner={"lr": 0.01, "entropy_coef": 0.01},  # the tiny model's rewards are constant: entropy moves both adapters
            simulator_learner={"lr": 0.01, "entropy_coef": 0.01},
            eval={**config(tiny_model_dir)["eval"], "every": 3},  # on Ray: the panel played by the workers
            executor=executor,
            ray={"workers": 1},
        )
        trainer = start(TrainConfig.model_validate(cfg), tmp_path / executor)
        records = trainer.run(progress=False)
        adapters = {name: trainer.chat.adapter_tensors(name) for name in ("agent", "simulator")}
        episodes = [json.loads(line) for p in sorted((tmp_path / executor / "rollouts").glob("*.jsonl")) for line in p.open()]
        runs[executor] = ([comparable(r) for r in records], adapters, episodes)
        assert "eval" in records[-1]
    (local_metrics, local_adapters, local_episodes), (ray_metrics, ray_adapters, ray_episodes) = runs["local"], runs["ray"]
    assert trainer.executor is None, "close() stops the workers"
    strip = lambda es: [{k: v for k, v in e.items() if k != "timings"} for e in es]
    assert len(ray_episodes) == 3 * 2 * 2 and strip(ray_episodes) == strip(local_episodes)
    assert {e["simulator_id"] for e in ray_episodes} == {e["simulator_id"] for e in local_episodes} and len(
        {e["simulator_id"] for e in ray_episodes}
    ) > 1
    assert ray_metrics == local_metrics
    for name, tensors in local_adapters.items():
        for key, value in tensors.items():
            assert torch.allclose(ray_adapters[name][key], value, atol=1e-6, rtol=0), (name, key)
    for name in ("agent", "simulator"):
        assert any(v.abs().sum() > 0 for k, v in local_adapters[name].items() if "lora_B" in k), f"the updates moved {name}"


def test_scope_train_on_ray_runs_the_trainer_as_a_learner_actor_and_resumes_exactly(tiny_model_dir, tmp_path, one_thread):
    """`scope train` with executor: ray (the trainer in a learner actor, rollouts on a worker) writes the
    local run's episodes, metrics and checkpoints; a run resumed from an older checkpoint on Ray plays
    the dropped step again identically."""
    import shutil

    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from scope_marl.cli import app
    from scope_marl.core import run_layout
    from tests.test_trainer import comparable, config

    def outcome(run):
        episodes = [json.loads(line) for p in sorted((run / "rollouts").glob("*.jsonl")) for line in p.open()]
        metrics = [comparable(json.loads(line)) for line in (run / "metrics.jsonl").read_text().splitlines()]
        last = run_layout.list_checkpoints(run)[-1]
        return (
            [{k: v for k, v in e.items() if k != "timings"} for e in episodes],
            metrics,
            load_file(run_layout.saved_adapter(last, "agent") / "adapter_model.safetensors"),
        )

    runner = CliRunner()
    results = {}
    for executor in ("local", "ray"):
        cfg = config(
            tiny_model_dir,
            steps=2,
            checkpoint_every=1,
            learner={"lr": 0.01, "entropy_coef": 0.01},
            eval={"every": 0},
            executor=executor,
            ray={"workers": 1},
        )
        (tmp_path / f"{executor}.yaml").write_text(yaml.safe_dump(cfg))
        result = runner.invoke(app, ["train", str(tmp_path / f"{executor}.yaml"), "--out", str(tmp_path / executor)])
        assert result.exit_code == 0, result.output
        assert "trained to step 2" in result.output
        results[executor] = outcome(tmp_path / executor)
    (local_eps, local_metrics, local_agent), (ray_eps, ray_metrics, ray_agent) = results["local"], results["ray"]
    assert len(ray_eps) == 8 and ray_eps == local_eps and ray_metrics == local_metrics
    assert local_agent.keys() == ray_agent.keys() and all(
        torch.allclose(ray_agent[k], v, atol=1e-6, rtol=0) for k, v in local_agent.items()
    )

    shutil.rmtree(run_layout.checkpoint_dir(tmp_path / "ray", 2))  # as if the run died before saving step 2
    result = runner.invoke(app, ["train", "--resume", str(tmp_path / "ray")])
    assert result.exit_code == 0, result.output
    assert outcome(tmp_path / "ray")[:2] == (local_eps, local_metrics)

    again = runner.invoke(app, ["train", str(tmp_path / "ray.yaml"), "--out", str(tmp_path / "ray")])
    assert again.exit_code == 2 and "already holds a run" in again.output and "Traceback" not in again.output


def test_scope_eval_fans_a_panel_out_over_ray_workers(tiny_model_dir, tmp_path, one_thread):
    """`scope eval --ray-workers 2`: one job per (simulator, task block), the same results as here (one
    block per simulator, so every batch has the local shape: equal to the last bit)."""
    from typer.testing import CliRunner

    from scope_marl.cli import app
    from tests.test_evaluation import scripted_panel

    (tmp_path / "panel.yaml").write_text(yaml.safe_dump(scripted_panel().model_dump(mode="json")))
    common = ["eval", "--checkpoint", "base", "--model", f"hf:{tiny_model_dir}", "--panel", str(tmp_path / "panel.yaml")]
    outputs = {}
    for name, extra in (("local", []), ("ray", ["--ray-workers", "2"])):
        result = CliRunner().invoke(app, [*common, "--out", str(tmp_path / name), *extra])
        assert result.exit_code == 0, result.output
        outputs[name] = json.loads((tmp_path / name / "eval.json").read_text())
    assert outputs["ray"] == outputs["local"] and outputs["ray"]["heldout"]["episodes"] == 12


def test_panel_blocks_on_ray_keep_their_group_numbers(tmp_path):
    """Two workers, one simulator: its four tasks cut into two blocks that keep their group numbers. The
    simulator is a round-robin rotation (group k plays member k mod 4, one giver among four), so a block
    numbered from 0 again would play the giver twice."""
    from scope_marl.evaluation.evaluate import evaluate_panel, load_agent
    from tests.test_evaluation import GIVES, REFUSES, scripted_panel

    members = [{"mode": "frozen", "id": f"m{i}", "model": f"scripted:{GIVES if i == 0 else REFUSES}"} for i in range(4)]
    rotation = {"id": "rot", "simulator": {"mode": "rotation", "order": "round_robin", "members": members}}
    panel = scripted_panel(tasks_per_simulator=4, simulators=[rotation])
    agent = load_agent("base", model="scripted:Would you donate to Save the Children?")
    local = evaluate_panel(panel, agent, log=lambda _: None)
    with pytest.raises(ValueError, match=r"ray.workers 4 x ray.num_cpus 1 needs 4 CPUs but the Ray cluster has 2; lower"):
        RayExecutor(None, workers=4)
    executor = RayExecutor(None, workers=2)
    messages = []
    try:
        fanned = evaluate_panel(panel, agent, log=messages.append, executor=executor)
    finally:
        executor.close()
    assert messages == ["evaluating base against 1 simulator(s): 2 jobs on 2 Ray worker(s)"]
    assert local["all"]["episodes"] == 8 and local["all"]["success"]["mean"] == 0.25
    assert fanned == local


def _dies_once(marker: str, value: int) -> int:
    """A job whose first run kills its worker process (as an out-of-memory kill would)."""
    from pathlib import Path

    if not Path(marker).exists():
        Path(marker).write_text("died")
        os._exit(1)
    return value


def test_a_job_whose_worker_dies_runs_again_on_its_replacement(tmp_path):
    ray.cloudpickle.register_pickle_by_value(__import__(__name__))  # the job lives in this test module
    executor = RayExecutor(None, workers=2)
    try:
        jobs = [functools.partial(_dies_once, str(tmp_path / "marker"), 7), lambda: 8, lambda: 9]
        assert executor.map(jobs) == [7, 8, 9] and executor.restarts == 1
        with pytest.raises(ZeroDivisionError):
            executor.map([lambda: 1 // 0])  # a job's own error is raised as it is
    finally:
        executor.close()


def async_ray_config(model_dir, k: int, **overrides) -> dict:
    from tests.test_trainer import config

    return config(model_dir, executor="ray", trainer={"mode": "async", "max_staleness": k}, **{"eval": {"every": 0}, **overrides})


def test_async_training_on_ray_with_staleness_zero_is_the_sync_run(tiny_model_dir, tmp_path, one_thread):
    """trainer.mode: async on Ray workers, k = 0: the batches the synchronous loop trains on, the same losses."""
    from scope_marl.config import TrainConfig
    from scope_marl.experiment import start
    from tests.test_async_training import episodes_of, same_learning
    from tests.test_trainer import config

    sync = start(TrainConfig.model_validate(config(tiny_model_dir, steps=3, eval={"every": 0})), tmp_path / "sync").run(progress=False)
    trainer = start(TrainConfig.model_validate(async_ray_config(tiny_model_dir, 0, steps=3, ray={"workers": 1})), tmp_path / "ray")
    assert "Ray worker" in trainer.executor.describe() and trainer.executor.asynchronous
    played = trainer.run(progress=False)
    for a, b in zip(played, sync, strict=True):
        assert a["train_agent"]["loss"] == pytest.approx(b["train_agent"]["loss"], abs=1e-6)
        assert same_learning(a) == same_learning(b) and a["train_agent"]["staleness_mean"] == 0.0
    strip = lambda e: {k: v for k, v in e.items() if k not in ("metadata", "timings")}
    assert [strip(e) for e in episodes_of(tmp_path / "ray")] == [strip(e) for e in episodes_of(tmp_path / "sync")]


def test_async_population_training_on_ray_plays_each_batch_with_its_member_as_the_sync_run(tiny_model_dir, tmp_path, one_thread):
    """Population co-training, async on a Ray worker, k = 0: the worker gets the member drawn for each
    batch with the batch (not with a push), so the run is the synchronous pool run: the same members,
    episodes and losses. (One worker: two would batch their decodes differently from the local run.)"""
    from scope_marl.config import TrainConfig
    from scope_marl.experiment import start
    from tests.test_async_training import assert_trained_alike, episodes_of, pool_run
    from tests.test_trainer import config

    pool = pool_run(tiny_model_dir, selection="latest")
    sync = start(TrainConfig.model_validate(config(tiny_model_dir, steps=3, **pool)), tmp_path / "sync").run(progress=False)
    trainer = start(TrainConfig.model_validate(async_ray_config(tiny_model_dir, 0, steps=3, ray={"workers": 1}, **pool)), tmp_path / "ray")
    played = trainer.run(progress=False)
    assert [r["pool_member"] for r in played] == [r["pool_member"] for r in sync] and len({r["pool_member"] for r in played}) == 3
    assert_trained_alike(played, sync, roles=("train_agent", "train_user"))
    strip = lambda e: {k: v for k, v in e.items() if k not in ("metadata", "timings")}
    assert [strip(e) for e in episodes_of(tmp_path / "ray")] == [strip(e) for e in episodes_of(tmp_path / "sync")]


def test_async_training_on_ray_replaces_a_worker_killed_with_a_batch_in_flight(tiny_model_dir, tmp_path, one_thread):
    """A worker killed while a batch is queued on it (k = 1: the next batch plays during the update) is
    replaced; the batch is played again by the replacement (with the newest adapters, so never staler
    than k) and the run trains every step once on every episode of it."""
    from scope_marl.config import TrainConfig
    from scope_marl.experiment import start
    from tests.test_async_training import episodes_of

    k, steps = 1, 4
    cfg = TrainConfig.model_validate(
        async_ray_config(
            tiny_model_dir, k, steps=steps, tasks_per_step=4, ray={"workers": 2}, agent_sampling={"temperature": 1.0, "max_new_tokens": 24}
        )
    )
    trainer = start(cfg, tmp_path / "run")
    executor = trainer.executor
    victim = executor.worker_pids()[0]

    def kill_after_the_first_update(record: dict) -> None:
        if record["step"] == 1:
            assert len(trainer._in_flight) == k, "a batch is queued on the workers"
            os.kill(victim, signal.SIGKILL)

    records = trainer.run(progress=False, on_step=kill_after_the_first_update)
    assert executor.restarts == 1
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert all(0 <= r["train_agent"]["staleness_mean"] <= k for r in records)
    assert max(r["train_agent"]["staleness_mean"] for r in records) > 0, "the workers never played ahead"
    episodes = episodes_of(tmp_path / "run")
    ids = [e["episode_id"] for e in episodes]
    assert len(ids) == len(set(ids)) == steps * cfg.tasks_per_step * cfg.rollout.group_size
    groups = sorted({e["group_id"] for e in episodes})
    assert len(groups) == steps * cfg.tasks_per_step, "every group of every batch, once"


def test_scope_train_on_ray_in_async_mode_plays_ahead(tiny_model_dir, tmp_path, one_thread):
    """`scope train` with executor: ray runs the trainer as a learner actor; with trainer.mode: async that
    actor takes async steps (it once took sync steps whatever the mode), and when it ends the run's
    figures go to W&B as a local run's do (they once never did)."""
    from typer.testing import CliRunner

    from scope_marl.cli import app

    pytest.importorskip("wandb", reason="the wandb extra is not installed; `make setup` installs it")
    from tests.test_trackers import offline_runs

    # W&B without a key logs offline; the figures once the last step is trained reach it from the actor too.
    cfg = async_ray_config(tiny_model_dir, 1, steps=3, ray={"workers": 1}, logging={"trackers": ["wandb"], "wandb": {"mode": "offline"}})
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(cfg))
    result = CliRunner().invoke(app, ["train", str(tmp_path / "train.yaml"), "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["async"]["in_flight"] for r in records] == [1, 1, 0]
    assert [r["train_agent"]["staleness_mean"] for r in records] == [0.0, 1.0, 1.0]
    ((_, rows, _),) = offline_runs(tmp_path / "run")
    assert any(row.get("figures/collapse/_type") == "image-file" for row in rows), "the figures reached W&B"
