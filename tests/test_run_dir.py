"""The run-directory lifecycle every kind of run shares (training.run_dir.RunDir): one process per run,
start versus resume, metrics trimmed on resume, and a run's own config from an older release."""

from __future__ import annotations

import json

import pytest
import yaml

from scope_marl.config import ConfigError, TrainConfig, dump_config, load_config
from scope_marl.core.run_lock import RunLocked
from scope_marl.rollout import RolloutRecorder
from scope_marl.training.run_dir import RunDir


def test_a_new_run_is_refused_where_a_run_already_is_and_a_resume_where_none_is(tmp_path):
    run = RunDir.new(tmp_path / "run", "scope sft")
    run.append_metrics({"step": 1})
    with pytest.raises(RunLocked):
        RunDir.new(tmp_path / "run", "scope sft")  # while the first holds it
    run.release()
    with pytest.raises(FileExistsError, match=r"continue it with: scope sft --resume .*run"):
        RunDir.new(tmp_path / "run", "scope sft")
    with pytest.raises(FileNotFoundError, match="is it a run directory written by scope sft"):
        RunDir.existing(tmp_path / "elsewhere", "scope sft")
    assert not (tmp_path / "elsewhere").exists(), "a refused resume creates nothing"


def test_a_failed_start_releases_the_lock(tmp_path):
    run = RunDir.new(tmp_path / "run")
    with pytest.raises(ValueError), run.released_on_error():
        raise ValueError("the model could not load")
    RunDir.new(tmp_path / "run").release()  # free again


def test_resume_trims_later_metrics_a_torn_line_and_later_rollout_batches(tmp_path):
    run = RunDir.new(tmp_path / "run")
    for step in (1, 2, 3):
        run.append_metrics({"step": step})
    with run.metrics_path.open("a") as f:
        f.write('{"step": 4, "rew')  # a crash mid-append
    recorder = RolloutRecorder(run.rollouts)
    for _ in range(4):
        recorder.write_batch([])
    messages = []
    run.trim_metrics(2, messages.append)
    run.trim_rollouts(2, messages.append)
    assert [json.loads(line)["step"] for line in run.metrics_path.read_text().splitlines()] == [1, 2]
    assert sorted(p.name for p in run.rollouts.iterdir()) == ["episodes-00000.jsonl", "episodes-00001.jsonl"]
    assert any("torn last line" in m for m in messages) and any("removed 2 rollout batch(es)" in m for m in messages)
    run.metrics_path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match="line 2 is not a metrics record"):
        run.trim_metrics(2, messages.append)  # damage in the middle is not a torn write: the user decides


@pytest.mark.parametrize(("old", "baseline"), [({"constant_groups": "zero"}, "group"), ({"constant_groups": "batch"}, "group_else_batch")])
def test_a_runs_own_config_from_an_older_release_resumes_with_its_meaning(tmp_path, old, baseline):
    """Every run saved before constant_groups was folded into baseline holds the key; a config a user
    writes with it is refused, naming the replacement."""
    run = RunDir.new(tmp_path / "run")
    dump_config(TrainConfig(), run.path / "config.yaml")
    data = yaml.safe_load((run.path / "config.yaml").read_text())
    data["learner"].update(old)
    (run.path / "config.yaml").write_text(yaml.safe_dump(data))
    assert run.read_config(TrainConfig).learner.baseline == baseline
    with pytest.raises(ConfigError, match="learner.constant_groups: constant_groups was removed"):
        load_config(run.path / "config.yaml", TrainConfig)


# ---- faults found by a trial through the CLI --------------------------------------------------------


def test_a_directory_holding_checkpoints_is_not_a_new_runs_even_without_metrics(tmp_path):
    from scope_marl.training import checkpoint

    checkpoint.save(tmp_path / "run", 3, None, [], {}, {}, {})
    with pytest.raises(FileExistsError, match="already holds a run; continue it with: scope train --resume"):
        RunDir.new(tmp_path / "run")  # its metrics.jsonl was deleted: the old step 3 would stay newest


def test_a_deleted_batch_never_makes_the_next_one_overwrite_a_later_one(tmp_path):
    recorder = RolloutRecorder(tmp_path)
    for _ in range(3):
        recorder.write_batch([])
    (tmp_path / "episodes-00001.jsonl").unlink()
    later = (tmp_path / "episodes-00002.jsonl").read_bytes()
    assert RolloutRecorder(tmp_path).write_batch([]).name == "episodes-00003.jsonl"
    assert (tmp_path / "episodes-00002.jsonl").read_bytes() == later


def test_a_whole_checkpoint_that_does_not_fit_the_config_is_an_error_not_damage(tmp_path):
    """lora.r edited before --resume: the checkpoint is whole, so it is neither set aside nor skipped."""
    from scope_marl.training import checkpoint

    checkpoint.save(tmp_path, 1, None, [], {}, {}, {})
    checkpoint.save(tmp_path, 2, None, [], {}, {}, {})

    def load(path):
        raise RuntimeError("size mismatch for lora_A.weight: copying a param with shape [8, 64], the model has [16, 64]")

    with pytest.raises(checkpoint.CheckpointMismatch, match=r"step-000002 is whole .* was config.yaml changed"):
        checkpoint.load_newest(tmp_path, load, print)
    assert [p.name for p in sorted((tmp_path / "checkpoints").iterdir())] == ["step-000001", "step-000002"]


def test_a_resumed_run_whose_pool_is_gone_stops_instead_of_starting_a_new_one(tmp_path):
    from types import SimpleNamespace

    from scope_marl.training.population import Population

    population = Population(SimpleNamespace(every=1), 0, tmp_path, None, "simulator", None)
    population.load_state({"pool": str(tmp_path / "pool"), "member_rewards": {}})
    with pytest.raises(FileNotFoundError, match=r"no pool manifest, but the checkpoint of step 4 was trained against that pool"):
        population.rewind(4, print)
    fresh = Population(SimpleNamespace(every=1), 0, tmp_path, None, "simulator", None)
    fresh.load_state({"pool": None, "member_rewards": {}})
    fresh.rewind(0, print)  # a checkpoint from before any pool: nothing to find


def test_a_checkpoint_config_from_an_older_release_is_no_edit(tmp_path):
    """A field added since the checkpoint was written (absent from its saved config) takes its default,
    and is not an edit a resume refuses; a real edit still is."""
    from types import SimpleNamespace

    from scope_marl.core import run_layout
    from scope_marl.experiment import _config_edits
    from scope_marl.training.config_edits import ConfigEditRefused

    cfg = TrainConfig.model_validate({"env": {"name": "say_the_word"}, "simulator": {"mode": "frozen", "model": "scripted:Hi."}})
    older = cfg.model_dump(mode="json")
    del older["deterministic"], older["learner"]["gradient_checkpointing"]  # fields a newer release added
    checkpoint = run_layout.checkpoint_dir(tmp_path, 3)
    checkpoint.mkdir(parents=True)
    (checkpoint / run_layout.STATE).write_text(json.dumps({"step": 3, "config": older}))
    run = SimpleNamespace(path=tmp_path)
    assert _config_edits(run, cfg, print) == {}
    older["lora"]["r"] = 4
    (checkpoint / run_layout.STATE).write_text(json.dumps({"step": 3, "config": older}))
    with pytest.raises(ConfigEditRefused, match=r"lora\.r: 4 -> 16"):
        _config_edits(run, cfg, print)
