"""The config schema: the shipped configs load, and every error names the field, the allowed values and the fix
(formerly tests/test_config_and_rollout_cli.py; `scope rollout` itself is tested in tests/test_rollout_cli.py)."""

from __future__ import annotations

import pytest

from scope_marl.config import ConfigError, RolloutRunConfig, load_config


def write(tmp_path, text, name="cfg.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_configs_load():
    from pathlib import Path

    from scope_marl.config import SFTConfig, TrainConfig

    root = Path(__file__).parents[1] / "configs"
    rollout, train = sorted(root.glob("rollout*.yaml")), sorted(root.glob("train_*.yaml"))
    assert len(rollout) >= 4 and len(train) == 18
    for path in rollout:
        assert isinstance(load_config(path), RolloutRunConfig)
    arms = {load_config(path, TrainConfig).simulator.mode for path in train}
    twins = sorted(p for p in (root / "gpu").glob("train_*.yaml") if not p.name.endswith(("_vllm.yaml", "_gpu.yaml")))
    assert [p.name for p in twins] == [p.name for p in train if p.name.startswith("train_tau2_")]
    for path in twins:
        assert load_config(path, TrainConfig).executor == "ray"
    on_gpu = load_config(root / "gpu" / "train_p4g_cotrain_gpu.yaml", TrainConfig)  # bench/gpu_check.sh's run, README's GPU command
    assert on_gpu.hardware.device == "auto" and on_gpu.sampler is None and on_gpu.simulator.mode == "trainable"
    on_vllm = load_config(root / "gpu" / "train_p4g_cotrain_vllm.yaml", TrainConfig)  # bench/gpu_run.sh's run
    assert (
        on_vllm.sampler.startswith("vllm:embedded@") and on_vllm.learner.old_logprobs == on_vllm.simulator_learner.old_logprobs == "learner"
    )
    assert arms == {"frozen", "rotation", "persona_guided", "vs", "trainable"}
    sft = load_config(root / "sft_p4g_simulator.yaml", SFTConfig)
    assert (
        sft.env.source == "corpus" and sft.env.word_limit == load_config(root / "train_p4g_sft_baseline.yaml", TrainConfig).env.word_limit
    )
    for arm in ("train_p4g_sft_baseline.yaml", "train_p4g_cotrain_from_sft.yaml"):  # both start from scope sft's output
        simulator = load_config(root / arm, TrainConfig).simulator
        assert "runs/sft/adapter" in (simulator.adapter, getattr(simulator, "init", None))


@pytest.mark.parametrize(
    "text,needles",
    [
        ("split: training\n", ["split", "'train', 'validation' or 'test'", "training"]),
        ("simulator: {mode: verbalised}\n", ["simulator.mode", "'frozen'"]),
        ("agent: {modle: embedded}\n", ["agent.modle", "unknown field", "allowed fields here: model, adapter"]),
        ("rollout: {group_size: 0}\n", ["rollout.group_size", "greater than or equal to 1"]),
        ("agent: {sampling: {top_p: 2}}\n", ["agent.sampling.top_p", "less than or equal to 1"]),
        ("- just\n- a list\n", ["mapping"]),
        ("env: {name: [unclosed\n", ["not valid YAML"]),
    ],
)
def test_config_errors_name_the_field_and_the_allowed_values(tmp_path, text, needles):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    for needle in needles:
        assert needle in str(info.value)


def test_a_misspelt_field_gets_a_did_you_mean_and_the_allowed_fields(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "rollout: {group_sise: 2}\n"))
    assert "rollout.group_sise: unknown field" in str(info.value) and "did you mean 'group_size'?" in str(info.value)


def test_learner_sections_are_typed_so_their_typos_fail_when_the_config_loads(tmp_path):
    from scope_marl.config import LearnerConfig, TrainConfig

    cfg = load_config(write(tmp_path, "learner: {lr: 0.001, kl_coef: 0.0}\nsimulator_learner: {lr: 0.01}\n"), TrainConfig)
    assert isinstance(cfg.learner, LearnerConfig) and cfg.learner.lr == 0.001 and cfg.simulator_learner.lr == 0.01
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "learner: {lrr: 0.001}\n"), TrainConfig)
    assert "learner.lrr: unknown field" in str(info.value) and "did you mean 'lr'?" in str(info.value)
    with pytest.raises(ConfigError, match=r"learner\.aggregation"):
        load_config(write(tmp_path, "learner: {aggregation: mean}\n"), TrainConfig)


@pytest.mark.parametrize(
    ("learner", "fix"),
    [
        ("{constant_groups: batch}", "replace `constant_groups: batch` with `baseline: group_else_batch`"),
        ("{constant_groups: batch, baseline: batch}", "remove `constant_groups: batch`: `baseline: batch` already"),
        ("{constant_groups: zero, lr: 0.001}", "remove `constant_groups: zero`"),
        ("{constant_groups: sometimes}", "`constant_groups: batch` is now `baseline: group_else_batch`"),
    ],
)
def test_constant_groups_was_folded_into_baseline_and_an_old_config_says_so(tmp_path, learner, fix):
    from scope_marl.config import LearnerConfig, TrainConfig

    for section in ("learner", "simulator_learner"):
        with pytest.raises(ConfigError) as info:
            load_config(write(tmp_path, f"{section}: {learner}\n"), TrainConfig)
        message = str(info.value)
        assert f"{section}.constant_groups: constant_groups was removed: folded into `baseline`; {fix}" in message, message
        assert "(got" not in message  # the section is not dumped back
    with pytest.raises(ValueError, match="constant_groups was removed"):
        LearnerConfig(constant_groups="batch")
    assert "constant_groups" not in LearnerConfig.model_fields
    assert LearnerConfig(baseline="group_else_batch").baseline == "group_else_batch"
    with pytest.raises(ConfigError, match=r"learner\.baseline: Input should be 'group', 'batch' or 'group_else_batch'"):
        load_config(write(tmp_path, "learner: {baseline: constant}\n"), TrainConfig)


def test_a_section_without_its_kind_lists_the_kinds(tmp_path):
    with pytest.raises(ConfigError, match=r"env\.name: missing; set name to one of: say_the_word, p4g, tau2, coop"):
        load_config(write(tmp_path, "env: {num_tasks: 2}\n"))
    with pytest.raises(ConfigError, match=r"simulator\.mode: missing; set mode to one of: frozen, persona_guided, vs, trainable, pool"):
        load_config(write(tmp_path, "simulator: {model: embedded}\n"))
    with pytest.raises(ConfigError, match=r"env\.name: Input tag 'nope' .* expected tags: 'say_the_word', 'p4g', 'tau2', 'coop'"):
        load_config(write(tmp_path, "env: {name: nope}\n"))
