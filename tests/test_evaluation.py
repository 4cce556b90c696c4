"""Evaluation: intervals, pass^k, panels (held-out aggregate), policy entropy, diversity, determinism."""

from __future__ import annotations

import itertools
import json
import math
import random

import numpy as np
import pytest
import torch

from scope_marl.assembly import ModelCache
from scope_marl.config import ConfigError
from scope_marl.evaluation.diversity import Coverage, distinct_n, first_sentence, unique_share
from scope_marl.evaluation.evaluate import AgentUnderTest, evaluate_panel, markdown
from scope_marl.evaluation.panel import Panel, builtin_panels, load_panel
from scope_marl.evaluation.stats import bootstrap_ci, pass_hat_k, pass_hat_k_curve

# ---- statistics ----------------------------------------------------------------------------------


def test_bootstrap_interval_covers_the_true_mean_at_about_the_nominal_rate():
    rng = np.random.default_rng(0)
    trials, covered = 300, 0
    for t in range(trials):
        sample = rng.exponential(scale=2.0, size=60)  # skewed on purpose; true mean 2.0
        low, high = bootstrap_ci(sample, 0.95, n_resamples=1000, seed=t)
        covered += low <= 2.0 <= high
    # Percentile bootstrap on n = 60 skewed data undercovers slightly; 300 trials give +-2.5% noise.
    assert 0.88 <= covered / trials <= 0.99


def test_bootstrap_edge_cases():
    assert bootstrap_ci([0.3]) == (0.3, 0.3)
    assert all(math.isnan(x) for x in bootstrap_ci([]))
    assert bootstrap_ci([1.0] * 5) == (1.0, 1.0)
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ci([1, 2], confidence=95)


@pytest.mark.parametrize("c,n,k", [(3, 5, 2), (4, 4, 3), (0, 3, 1), (2, 6, 3), (5, 8, 4)])
def test_pass_hat_k_is_the_chance_that_k_drawn_samples_all_succeed(c, n, k):
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = sum(all(outcomes[i] for i in s) for s in subsets) / len(subsets)
    assert pass_hat_k(c, n, k) == pytest.approx(brute)
    assert pass_hat_k(c, n, k) == pytest.approx(math.comb(c, k) / math.comb(n, k))


def test_pass_hat_k_curve_averages_tasks_up_to_the_smallest_sample_count():
    curve = pass_hat_k_curve([(2, 2), (1, 2), (0, 3)])
    assert curve == {1: pytest.approx((1 + 0.5 + 0) / 3), 2: pytest.approx((1 + 0 + 0) / 3)}
    with pytest.raises(ValueError, match="k must be"):
        pass_hat_k(1, 2, 3)


# ---- diversity -----------------------------------------------------------------------------------


def test_distinct_n_and_unique_openings_by_hand():
    texts = ["the cat sat", "the cat ran"]
    assert distinct_n(texts, 1) == pytest.approx(4 / 6)  # the, cat, sat, ran of 6 words
    assert distinct_n(texts, 2) == pytest.approx(3 / 4)  # "the cat" twice, "cat sat", "cat ran"
    assert distinct_n(["hi"], 2) is None
    assert first_sentence("Hello there! How are you?") == "hello there"
    assert unique_share(["Hello there! A", "hello, there! B", "Good day."]) == pytest.approx(2 / 3)


def test_coverage_counts_reference_clusters_reached():
    children = [f"children need food and school number {i}" for i in range(6)]
    tax = [f"donations are tax deductible receipt form {i}" for i in range(6)]
    coverage = Coverage(children + tax, k=2, seed=0)
    assert coverage.covered(children[:2]) == pytest.approx(0.5)
    assert coverage.covered(children[:1] + tax[:1]) == pytest.approx(1.0)
    assert coverage.covered([]) is None
    with pytest.raises(ValueError, match="reference texts"):
        Coverage(["same"] * 3)


# ---- panels --------------------------------------------------------------------------------------


def test_builtin_panels_load_and_mark_nothing_as_training():
    assert {"offline", "api"} <= set(builtin_panels())
    offline = load_panel("offline")
    assert offline.split == "test" and len(offline.simulators) >= 5
    modes = {s.simulator.mode for s in offline.simulators}
    assert {"frozen", "persona_guided", "vs"} <= modes, "prompt variants, persona guidance and VS on / off"
    assert len({s.simulator.sampling.temperature for s in offline.simulators}) >= 3
    assert len(load_panel("api").simulators) == 6
    assert not any(s.training for s in offline.simulators)


def test_the_tau2_panels_hold_no_training_user_of_the_shipped_tau2_configs():
    from pathlib import Path

    from scope_marl.config import TrainConfig, load_config

    for name in ("tau2-offline", "tau2-api"):
        panel = load_panel(name)
        assert panel.env.name == "tau2" and panel.env.domain == "retail" and panel.samples_per_task == 4  # pass^1..4
    offline = load_panel("tau2-offline")
    assert {s.simulator.model for s in offline.simulators} == {"embedded"}
    assert {"frozen", "persona_guided", "vs"} <= {s.simulator.mode for s in offline.simulators}
    configs = sorted((Path(__file__).parents[1] / "configs").glob("train_tau2_retail_*.yaml"))
    assert len(configs) == 4
    for path in configs:
        training = load_config(path, TrainConfig).simulator
        for s in offline.simulators:
            same = (s.simulator.mode, s.simulator.prompt_prefix if hasattr(s.simulator, "prompt_prefix") else "", s.simulator.sampling)
            assert same != (training.mode, getattr(training, "prompt_prefix", ""), training.sampling), (path.name, s.id)


def test_panel_errors_name_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("simulators:\n  - id: a\n    simulator: {mode: frozen, model: embedded}\n    trainig: true\n")
    with pytest.raises(ConfigError, match=r"simulators\[0\]\.trainig: unknown field .*allowed fields here: id, training"):
        load_panel(bad)
    dup = tmp_path / "dup.yaml"
    dup.write_text("simulators:\n  - {id: a, simulator: {mode: frozen}}\n  - {id: a, simulator: {mode: frozen}}\n")
    with pytest.raises(ConfigError, match="distinct"):
        load_panel(dup)
    with pytest.raises(ConfigError, match="built-in: api, coop-offline, offline"):
        load_panel("nope")


# ---- evaluating an agent -------------------------------------------------------------------------

GIVES, REFUSES = "Okay, I will donate. [DONATE $2]", "No thanks, I will not donate. [DONATE $0]"


def scripted_panel(**overrides) -> Panel:
    return Panel.model_validate(
        {
            "name": "scripted",
            "env": {"name": "p4g", "source": "synthetic", "synthetic_tasks": 40, "max_exchanges": 2},
            "tasks_per_simulator": 3,
            "samples_per_task": 2,
            "agent_sampling": {"temperature": 1.0, "max_new_tokens": 8},
            "coverage": {"clusters": 3, "reference": "pooled"},
            "simulators": [
                {"id": "giver", "training": True, "simulator": {"mode": "frozen", "model": f"scripted:{GIVES}"}},
                {"id": "refuser", "simulator": {"mode": "frozen", "model": f"scripted:{REFUSES}"}},
                {"id": "mixed", "simulator": {"mode": "frozen", "model": f"scripted:{GIVES}|{REFUSES}|{REFUSES}"}},
            ],
            **overrides,
        }
    )


@pytest.fixture
def agent(tiny_chat):
    return AgentUnderTest(tiny_chat, None, "tiny", ModelCache())


def test_held_out_aggregate_excludes_training_simulators(agent):
    results = evaluate_panel(scripted_panel(), agent, log=lambda _: None)
    sims = results["simulators"]
    assert sims["giver"]["reward"]["mean"] == 1.0 and sims["refuser"]["reward"]["mean"] == 0.0
    assert sims["giver"]["training"] and not sims["refuser"]["training"]
    assert results["heldout"]["simulators"] == ["refuser", "mixed"]
    held = [sims[s]["reward"]["mean"] * sims[s]["completed"] for s in ("refuser", "mixed")]
    assert results["heldout"]["reward"]["mean"] == pytest.approx(sum(held) / (sims["refuser"]["completed"] + sims["mixed"]["completed"]))
    assert results["heldout"]["reward"]["mean"] < results["all"]["reward"]["mean"], "the training simulator is easier and left out"
    assert results["heldout"]["episodes"] == 12 and results["all"]["episodes"] == 18
    assert sims["giver"]["pass_k"] == {1: 1.0, 2: 1.0} and sims["refuser"]["pass_k"] == {1: 0.0, 2: 0.0}
    assert sims["giver"]["success"]["mean"] == 1.0
    table = markdown(json.loads(json.dumps(results)))  # what scope eval writes, after a JSON round trip
    assert "| giver | yes | 6 | 1.000 [1.000, 1.000] |" in table and "**held-out**" in table


def test_policy_entropy_equals_a_hand_computed_value(agent, tiny_chat):
    panel = scripted_panel(
        simulators=[{"id": "refuser", "simulator": {"mode": "frozen", "model": f"scripted:{REFUSES}"}}],
        tasks_per_simulator=1,
        samples_per_task=1,
        agent_sampling={"temperature": 0.8, "max_new_tokens": 5},
    )
    from scope_marl.assembly import build_env
    from scope_marl.envs import AGENT
    from scope_marl.evaluation.evaluate import play

    env = build_env(panel.env)
    (episode,) = play(panel, panel.simulators[0], agent, env)
    stream = episode.streams[AGENT]
    ids = stream.prompt_ids + stream.response_ids
    with torch.no_grad():
        logits = tiny_chat.model(input_ids=torch.tensor([ids])).logits[0]
    by_hand = []
    for j, m in enumerate(stream.loss_mask):
        if m:
            z = logits[len(stream.prompt_ids) + j - 1].double() / 0.8
            p = torch.softmax(z, -1)
            by_hand.append(float(-(p * torch.log(p)).sum()))
    results = evaluate_panel(panel, agent, log=lambda _: None)
    assert results["simulators"]["refuser"]["agent_tokens"] == len(by_hand) > 0
    assert results["simulators"]["refuser"]["policy_entropy"] == pytest.approx(sum(by_hand) / len(by_hand), abs=1e-4)


def test_evaluating_twice_with_the_same_seed_gives_identical_numbers(agent):
    torch.use_deterministic_algorithms(True)
    try:
        first = evaluate_panel(scripted_panel(), agent, log=lambda _: None)
        random.seed(123)
        torch.manual_seed(123)  # global RNG state must not matter
        second = evaluate_panel(scripted_panel(), agent, log=lambda _: None)
        other_seed = evaluate_panel(scripted_panel(seed=1), agent, log=lambda _: None)
    finally:
        torch.use_deterministic_algorithms(False)
    assert first == second
    assert (
        first["simulators"]["mixed"]["diversity"] != other_seed["simulators"]["mixed"]["diversity"]
        or first["simulators"]["mixed"]["policy_entropy"] != other_seed["simulators"]["mixed"]["policy_entropy"]
    )


# ---- inside training, scope eval on a run, scope report --------------------------------------------


@pytest.mark.integration
def test_periodic_panel_evaluation_then_scope_eval_and_report_on_the_run(tiny_model_dir, tmp_path, monkeypatch):
    import yaml
    from typer.testing import CliRunner

    from scope_marl.cli import app
    from scope_marl.config import TrainConfig
    from scope_marl.core.run_layout import resolve_checkpoint
    from scope_marl.evaluation.evaluate import load_agent
    from scope_marl.experiment import start

    model = f"hf:{tiny_model_dir}"
    panel = tmp_path / "panel.yaml"
    panel.write_text(
        yaml.safe_dump(
            {
                "name": "tiny-panel",
                "env": {"name": "say_the_word", "num_tasks": 8, "max_exchanges": 2},
                "tasks_per_simulator": 2,
                "samples_per_task": 2,
                "agent_sampling": {"temperature": 1.0, "max_new_tokens": 6},
                "coverage": {"clusters": 2},
                "simulators": [
                    {
                        "id": "train-sim",
                        "simulator": {"mode": "frozen", "model": model, "sampling": {"temperature": 1.0, "max_new_tokens": 6}},
                    },
                    {
                        "id": "hot",
                        "simulator": {
                            "mode": "frozen",
                            "model": model,
                            "prompt_prefix": "Be brief.",
                            "sampling": {"temperature": 1.5, "max_new_tokens": 6},
                        },
                    },
                    {"id": "scripted", "simulator": {"mode": "frozen", "model": "scripted:hello|ok"}},
                ],
            }
        )
    )
    cfg = TrainConfig.model_validate(
        {
            "model": model,
            "env": {"name": "say_the_word", "num_tasks": 8, "max_exchanges": 2},
            "agent_sampling": {"temperature": 1.0, "max_new_tokens": 6},
            "simulator": {"mode": "frozen", "id": "train-sim", "model": model, "sampling": {"temperature": 1.0, "max_new_tokens": 6}},
            "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
            "learner": {"lr": 0.01},
            "rollout": {"group_size": 2, "max_concurrent": 16, "on_turn_limit": "continue", "progress": False},
            "tasks_per_step": 2,
            "steps": 2,
            "checkpoint_every": 1,
            "seed": 0,
            "eval": {"every": 1, "tasks": 2, "group_size": 2, "panel": str(panel)},
        }
    )
    run = tmp_path / "run"
    trainer = start(cfg, run)
    records = trainer.run(progress=False)
    assert trainer.cursor == 4, "evaluation never moves the training cursor"
    evaluation = records[0]["eval"]
    assert evaluation["simulators"]["train-sim"]["training"], "the training simulator's id is marked in the panel"
    assert evaluation["heldout"]["simulators"] == ["hot", "scripted"]
    assert evaluation["reward_agent"] == evaluation["heldout"]["reward"]["mean"]
    assert sorted(p.name for p in (run / "evals").iterdir()) == ["step-000001.json", "step-000002.json"]

    best = resolve_checkpoint(run)
    assert best == run / "checkpoints" / trainer.best[1] and trainer.best[1].startswith("step-")
    agent = load_agent(str(run))
    assert agent.adapter == "agent" and agent.label == str(best) and agent.step == int(trainer.best[1][5:])
    # scope eval on a run still training: the run prunes the chosen checkpoint while evaluation loads
    # the base model; evaluation reads the checkpoint it held, and says which one it was
    keep = tmp_path / "keep"
    __import__("shutil").copytree(best, keep)
    real_get = ModelCache.get

    def pruning_get(self, spec):
        __import__("shutil").rmtree(best, ignore_errors=True)
        return real_get(self, spec)

    monkeypatch.setattr(ModelCache, "get", pruning_get)
    held = load_agent(str(run))
    monkeypatch.undo()
    assert held.label == str(best) and held.step == agent.step and held.adapter == "agent"
    assert not best.exists()
    keep.rename(best)
    moved = tmp_path / "moved-run"
    run.rename(moved)  # the best checkpoint is stored by name, so a moved run still finds it
    assert resolve_checkpoint(moved) == moved / "checkpoints" / trainer.best[1]
    moved.rename(run)
    lone = tmp_path / "lone-checkpoint"
    __import__("shutil").copytree(best, lone)
    with pytest.raises(FileNotFoundError, match="--model SPEC"):
        load_agent(str(lone))

    runner = CliRunner()
    result = runner.invoke(
        app, ["eval", "--checkpoint", str(run), "--panel", str(panel), "--out", str(run / "eval"), "--training", "train-sim"]
    )
    assert result.exit_code == 0, result.output
    saved = json.loads((run / "eval" / "eval.json").read_text())
    assert saved["heldout"]["simulators"] == ["hot", "scripted"] and saved["agent"] == str(best)
    assert "| train-sim | yes |" in (run / "eval" / "eval.md").read_text()
    bad = runner.invoke(app, ["eval", "--checkpoint", str(run), "--panel", str(panel), "--out", str(tmp_path / "x"), "--training", "nope"])
    assert bad.exit_code == 2 and "not in the panel" in bad.output
    splits = runner.invoke(
        app, ["eval", "-c", str(run), "-p", str(panel), "--out", str(tmp_path / "both"), "--split", "test", "--split", "validation"]
    )
    assert splits.exit_code == 0, splits.output
    for split in ("test", "validation"):
        one = json.loads((tmp_path / "both" / split / "eval.json").read_text())
        assert one["split"] == split and set(one["heldout"]["pass_k_ci"]) == {"1", "2"}
        assert set(one["simulators"]) == {"train-sim", "hot", "scripted"}
    both = (tmp_path / "both" / "eval.md").read_text()
    assert "test split" in both and "validation split" in both and "pass^2 [95% CI]" in both
    bad_split = runner.invoke(app, ["eval", "-c", str(run), "-p", str(panel), "--out", str(tmp_path / "y"), "--split", "dev"])
    assert bad_split.exit_code == 2 and "--split 'dev' is not a split; use one of train, validation, test" in bad_split.output

    result = runner.invoke(app, ["report", str(run), str(run / "eval"), "--out", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    assert "![collapse curves](collapse.png)" in result.output, "printed as written, not eaten as rich markup"
    for name in ("collapse.png", "heldout.png"):
        assert (tmp_path / "report" / name).stat().st_size > 10_000
    text = (tmp_path / "report" / "report.md").read_text()
    assert "| run | 2 |" in text and "| train-sim (training) |" in text
    missing = runner.invoke(app, ["report", str(tmp_path / "empty"), "--out", str(tmp_path / "r2")])
    assert missing.exit_code == 2 and "neither metrics.jsonl" in missing.output


def test_gamma_statistics_by_hand():
    from scope_marl.evaluation.gamma import reply_stats

    stats = reply_stats(["No thanks. Bye", "no thanks!", "No, thanks.", "Sure! I'll give $1", "Maybe later."])
    # "no thanks" x3 (the first two share their first sentence; "No, thanks." normalizes the same), "sure" x1, "maybe later" x1
    assert stats["unique"] == 3 and stats["top1_mass"] == pytest.approx(0.6)
    assert stats["entropy"] == pytest.approx(-(0.6 * math.log(0.6) + 2 * 0.2 * math.log(0.2)))
    assert stats["zipf_slope"] < 0
    assert reply_stats(["same."] * 4) == {"samples": 4, "top1_mass": 1.0, "unique": 1, "entropy": 0.0, "zipf_slope": None}


def test_gamma_diagnosis_runs_on_scripted_simulators():
    from scope_marl.config import FrozenSimulatorConfig, VerbalizedConfig
    from scope_marl.envs.p4g import PersuasionForGood
    from scope_marl.evaluation.gamma import diagnose_gamma, paired_configs

    _plain, vs = paired_configs(FrozenSimulatorConfig(model="scripted:no"), k=3)
    assert isinstance(vs, VerbalizedConfig) and vs.model == "scripted:no" and vs.k == 3
    assert isinstance(paired_configs(vs, 3)[0], FrozenSimulatorConfig)
    env = PersuasionForGood(source="synthetic", synthetic_tasks=30)
    result = diagnose_gamma(FrozenSimulatorConfig(model="scripted:No thanks."), env, states=2, samples=8, vs_calls=2, log=lambda _: None)
    assert result["mean"]["plain"]["top1_mass"] == 1.0 and result["mean"]["plain"]["unique"] == 1
    with pytest.raises(ValueError, match="one LLM simulator"):
        diagnose_gamma(__import__("scope_marl.config", fromlist=["x"]).parse_simulator_spec("pool:/tmp/x"), env, log=lambda _: None)


def test_grouped_bootstrap_resamples_whole_tasks():
    # Two samples per task, equal within a task: the interval must equal the one over task means,
    # not the narrower one that treats the 2 x 30 samples as independent.
    rng = np.random.default_rng(1)
    per_task = rng.normal(size=30)
    values, groups = np.repeat(per_task, 2), np.repeat(np.arange(30), 2)
    grouped = bootstrap_ci(values, groups=groups, seed=3)
    assert grouped == pytest.approx(bootstrap_ci(per_task, seed=3))
    naive = bootstrap_ci(values, seed=3)
    assert naive[1] - naive[0] < 0.8 * (grouped[1] - grouped[0])
    assert bootstrap_ci([1.0, 3.0], groups=["t", "t"]) == (2.0, 2.0)
    assert all(math.isfinite(x) for x in bootstrap_ci([0.0, 1.0, 1.0], seed=-5)), "negative seeds work"


def test_coverage_ignores_case_and_punctuation_duplicates():
    coverage = Coverage(["Hi!", "hi.", "HI", "Hello there, friend", "hello there friend!"], k=8)
    assert coverage.k == 2 and coverage.reference_size == 2
    assert coverage.covered(["hi", "hello there friend"]) == 1.0


def test_collapse_series_puts_a_separate_evaluation_at_its_checkpoint_step():
    from scope_marl.evaluation.report import collapse_series

    held = {"mean": 0.5, "low": 0.25, "high": 0.75}
    records = [
        {
            "step": s,
            "reward_agent": {"mean": 0.1 * s},
            "train_agent": {"entropy": 1.0},
            **({"eval": {"heldout": {"reward": held}}} if s in (4, 8) else {}),
        }
        for s in range(1, 11)
    ]
    final = {"step": 6, "heldout": {"reward": {"mean": 0.9, "low": 0.8, "high": 1.0}}}
    points = collapse_series(records, final)
    assert [p["step"] for p in points if p["heldout_reward"] is not None] == [4, 6, 8]
    assert points[5]["heldout_reward"] == 0.9 and points[9]["heldout_reward"] is None
    base = {"step": None, "heldout": {"reward": held}}
    assert [p["step"] for p in collapse_series(records, base) if p["heldout_reward"] is not None] == [4, 8]


def test_training_simulators_are_marked_by_id_or_by_settings():
    from scope_marl.config import parse_simulator_spec
    from scope_marl.evaluation.periodic import training_ids

    panel = Panel.model_validate(
        {
            "simulators": [
                {"id": "same-settings", "simulator": {"mode": "frozen", "model": "scripted:a"}},
                {"id": "other", "simulator": {"mode": "frozen", "model": "scripted:b"}},
                {"id": "named", "simulator": {"mode": "frozen", "model": "scripted:c"}},
            ]
        }
    )
    assert training_ids(panel, parse_simulator_spec("frozen:scripted:a")) == {"same-settings"}
    rotation = parse_simulator_spec("rotation:frozen:scripted:b;frozen:scripted:z")
    assert training_ids(panel, rotation) == {"other"}
    named = parse_simulator_spec("frozen:scripted:q").model_copy(update={"id": "named"})
    assert training_ids(panel, named) == {"named"}


def test_panel_env_overrides_are_checked_against_the_env():
    with pytest.raises(ValueError, match=r"simulators\.0\.env: unknown field\(s\) \['sourse'\]; allowed: name, data_dir, source"):
        Panel.model_validate({"simulators": [{"id": "a", "env": {"sourse": "synthetic"}, "simulator": {"mode": "frozen"}}]})


def test_diagnose_spec_is_scope_diagnose_gamma_without_the_printing(tmp_path):
    from scope_marl.evaluation.gamma import diagnose_spec

    out = tmp_path / "gamma.json"
    result = diagnose_spec("frozen:scripted:No.", "say_the_word", out, lambda _: None, states=2, samples=4, vs_calls=2)
    assert json.loads(out.read_text()) == json.loads(json.dumps(result)) and result["mean"]["plain"]["unique"] == 1
    with pytest.raises(ValueError, match="unknown --env 'tau3'; use p4g or say_the_word"):
        diagnose_spec("frozen:scripted:No.", "tau3")


def test_evaluate_checkpoint_is_scope_eval_without_the_printing(tmp_path):
    """Overrides, two splits (one folder each, written as each ends) and the errors a user can fix."""
    from scope_marl.evaluation.evaluate import evaluate_checkpoint

    panel = tmp_path / "panel.yaml"
    panel.write_text(
        "name: tiny\nenv: {name: say_the_word}\nsplit: test\nsamples_per_task: 2\n"
        "simulators:\n  - {id: stubborn, simulator: {mode: frozen, model: 'scripted:No.'}}\n"
        "  - {id: willing, simulator: {mode: frozen, model: 'scripted:Apple!'}}\n"
    )
    messages = []
    report, results = evaluate_checkpoint(
        "base", str(panel), tmp_path / "out", "scripted:Say apple.", {"tasks_per_simulator": 2}, ["test", "validation"], log=messages.append
    )
    assert results == [tmp_path / "out" / "test" / "eval.json", tmp_path / "out" / "validation" / "eval.json"]
    first = json.loads(results[0].read_text())
    assert first["split"] == "test" and first["simulators"]["stubborn"]["episodes"] == 4 and report.name == "eval.md"
    assert "evaluating base against 2 simulator(s): 2 jobs on this process" in messages
    with pytest.raises(ValueError, match=r"--training \['nobody'\] not in the panel"):
        evaluate_checkpoint("base", str(panel), tmp_path / "x", "scripted:Hi.", training=["nobody"])
    with pytest.raises(ValueError, match="--split 'dev' is not a split"):
        evaluate_checkpoint("base", str(panel), tmp_path / "x", "scripted:Hi.", splits=["dev"])
