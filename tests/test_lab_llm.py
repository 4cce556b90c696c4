"""The LLM-policy lab on a tiny random-weight model: exact token streams, the act simulators' answers,
resume after a crash, settings checks and the whole quick run with its report."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from scope_marl.config.train import LearnerConfig
from scope_marl.lab import llm_agent
from scope_marl.lab.arms import LLM_QUICK, LLM_SETTINGS, LLMSettings
from scope_marl.lab.classifier import OTHER, StrategyClassifier
from scope_marl.lab.episodes import play
from scope_marl.lab.games import load_game
from scope_marl.lab.llm_agent import REPLIES, ROLE, UNCLEAR_ACT, UNCLEAR_REPLIES, LLMAgent
from scope_marl.lab.llm_loop import RESULT_FILE, evaluate_llm, reset_adapter, train_llm_arm
from scope_marl.lab.llm_run import SettingsMismatch, run_llm_lab
from scope_marl.lab.loop import update_simulator
from scope_marl.lab.panel import HELDOUT_PANEL, build_panel, load_panel
from scope_marl.lab.simulators import FrozenActs, TrainableActs
from scope_marl.training.learner import Learner

QUICK = LLM_SETTINGS["theory"].replace(**LLM_QUICK, max_new_tokens=12)  # with the full setting's KL anchor


@pytest.fixture
def game():
    return load_game("theory")


class LengthClassifier(StrategyClassifier):
    """A fake for the language only: the tiny random-weight model writes no words, so the real
    patterns would call every message ``other`` and the simulators would never be asked. Placing a
    message by its length mod (strategies + 1) gives every path (each strategy, and ``other``) real
    traffic; the real rules are tested on real sentences in tests/test_lab_classifier.py."""

    def classify(self, text: str) -> str:
        names = [*self.strategies, OTHER]
        return names[len(text) % len(names)]


@pytest.fixture(autouse=True)
def placeable(monkeypatch):
    monkeypatch.setattr(llm_agent, "StrategyClassifier", LengthClassifier)


def test_llm_dialogues_record_exact_streams(talky_chat, game):
    reset_adapter(talky_chat, QUICK, seed=0)
    agent = LLMAgent(talky_chat, game, max_new_tokens=12)
    generator = torch.Generator().manual_seed(3)
    turns = agent.batch(12, seed=5)
    d = play(game, turns, FrozenActs.sharpened(game, 4.0, 0.0), torch.tensor([0, 1, 2]), 4, generator, unclear_act=agent.unclear_act)
    turns.close()
    # One message per real turn, labelled by the classifier; an unplaceable one plays no strategy
    # (-1): the user says the unclear act, which is no simulator's turn.
    assert [len(m) for m in turns.messages] == d.mask.sum(1).tolist()
    unclear = 0
    for i, row in enumerate(turns.messages):
        for t, text in enumerate(row):
            label = int(turns.labels[i, t])
            assert label == agent.classifier.index(text)
            if label < len(game.strategies):
                assert int(d.strategies[i, t]) == label and bool(d.user_turns[i, t])
            else:
                unclear += 1
                assert int(d.strategies[i, t]) == -1 and not bool(d.user_turns[i, t])
                assert game.acts[int(d.acts[i, t])] == UNCLEAR_ACT["theory"] and float(d.user_logp[i, t]) == 0.0
    assert 0 < unclear < int(d.mask.sum()), "the tiny model should write both placeable and unplaceable messages"
    # The user's acts came back as reply texts (the act's table, or a puzzled reply after an
    # unclear message) in the agent's next prompt.
    prompts = [talky_chat.decode(b.context_ids) for b in turns.builders]
    for i in range(12):
        for t in range(int(d.mask[i].sum()) - 1):
            was_unclear = int(turns.labels[i, t]) == len(game.strategies)
            texts = UNCLEAR_REPLIES if was_unclear else REPLIES[game.acts[int(d.acts[i, t])]]
            assert any(text in prompts[i] for text in texts)
    # The learner scores exactly the sampled ids with the recorded log-probs (on-policy exactness).
    episodes = turns.episodes(d.rewards, d.group_ids, d.simulators, 4)
    assert [e.streams[ROLE].reward for e in episodes] == d.rewards.tolist()
    learner = Learner(talky_chat, ROLE, ROLE, 0.7, LearnerConfig(lr=1e-3, kl_coef=0.0))
    stats = learner.step(episodes)
    assert stats["logprob_gap"] < 1e-4


def test_evaluation_is_the_same_for_a_fresh_adapter_whatever_the_seed(talky_chat, game):
    panel = build_panel(game, load_panel(HELDOUT_PANEL))
    points = []
    for seed in (0, 1):
        reset_adapter(talky_chat, QUICK, seed)
        points.append(evaluate_llm(LLMAgent(talky_chat, game, max_new_tokens=12), game, panel, QUICK))
    assert points[0]["heldout_reward"] == points[1]["heldout_reward"]
    assert points[0]["examples"] == points[1]["examples"]
    assert set(points[0]["per_simulator"]) == {spec.id for spec in load_panel(HELDOUT_PANEL).simulators}
    assert abs(sum(points[0]["strategy_shares"].values()) - 1.0) < 1e-9


class Crash(Exception):
    pass


@pytest.mark.integration
@pytest.mark.parametrize("arm", ["single", "population"])
def test_a_crashed_run_resumes_to_the_same_result(talky_chat, game, tmp_path, arm):
    panel = build_panel(game, load_panel(HELDOUT_PANEL))
    s = QUICK.replace(pool_every=1)  # population: a snapshot every step, so the pool is rewound on resume
    start = {"heldout_reward": 0.0, "per_simulator": {}, "strategy_entropy": 0.0, "strategy_shares": {}, "distinct2": 0.0, "examples": []}
    whole = train_llm_arm(talky_chat, game, arm, 0, s, panel, tmp_path / "whole", start)

    def crash_after_two(step: int, seconds: float) -> None:
        if step == 2:
            raise Crash

    with pytest.raises(Crash):
        train_llm_arm(talky_chat, game, arm, 0, s, panel, tmp_path / "resumed", start, crash_after_two)
    assert not (tmp_path / "resumed" / RESULT_FILE).exists()
    resumed = train_llm_arm(talky_chat, game, arm, 0, s, panel, tmp_path / "resumed", start)
    strip = lambda curve: [{k: v for k, v in p.items() if k != "seconds"} for p in curve]
    assert strip(resumed["curve"]) == strip(whole["curve"])
    assert resumed["curve"][-1]["heldout_reward"] == whole["curve"][-1]["heldout_reward"]
    # A finished run is read back, not trained again.
    assert train_llm_arm(talky_chat, game, arm, 0, s, panel, tmp_path / "whole", start) == json.loads(
        (tmp_path / "whole" / RESULT_FILE).read_text()
    )


@pytest.mark.integration
def test_a_run_killed_mid_checkpoint_resumes_like_a_training_run(talky_chat, game, tmp_path):
    """The LLM lab's runs are run directories like scope train's: a checkpoint torn by a kill (here: its
    newest has lost bytes, and a half-written one lies beside it) is set aside with a warning, the one
    before it is used, the metrics of the later step go, and the run ends as if never stopped."""
    panel = build_panel(game, load_panel(HELDOUT_PANEL))
    start = {"heldout_reward": 0.0, "per_simulator": {}, "strategy_entropy": 0.0, "strategy_shares": {}, "distinct2": 0.0, "examples": []}
    whole = train_llm_arm(talky_chat, game, "population", 0, QUICK, panel, tmp_path / "whole", start)

    def crash_after_three(step: int, seconds: float) -> None:
        if step == 3:
            raise Crash

    run = tmp_path / "resumed"
    with pytest.raises(Crash):
        train_llm_arm(talky_chat, game, "population", 0, QUICK, panel, run, start, crash_after_three)
    assert [p.name for p in sorted((run / "checkpoints").iterdir())] == ["step-000002", "step-000003"]
    (run / "checkpoints" / ".step-000004.half.tmp").mkdir()  # a kill mid-write leaves only a temporary folder
    adapter = next((run / "checkpoints" / "step-000003").rglob("adapter_model.safetensors"))
    adapter.write_bytes(adapter.read_bytes()[:-8])  # ... or a disk that lost bytes of a whole one
    resumed = train_llm_arm(talky_chat, game, "population", 0, QUICK, panel, run, start)
    assert (run / "checkpoints" / "damaged-step-000003").is_dir()
    strip = lambda curve: [{k: v for k, v in p.items() if k != "seconds"} for p in curve]
    assert strip(resumed["curve"]) == strip(whole["curve"])
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3, 4], "each step's metrics once"
    assert [line["train_reward"] for line in lines] == [
        json.loads(line)["train_reward"] for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()
    ]


@pytest.mark.integration
def test_quick_run_writes_the_report_and_refuses_other_settings(talky_chat, tmp_path):
    out = tmp_path / "lab"
    lines = []
    results = run_llm_lab("theory", ["single", "vs_prob", "cotrain"], 2, out, quick=True, settings=QUICK, chat=talky_chat, log=lines.append)
    assert any("ETA" in line for line in lines)
    for name in ("results.json", "report.md", "report.html", "collapse.png", "start.json"):
        assert (out / name).exists(), name
    r = results["results"]
    assert r["single"]["heldout_vs_single"] is None and r["vs_prob"]["heldout_vs_single"] is not None
    assert [p["step"] for p in r["cotrain"]["curve"]] == [0, 2, 4]
    assert results["max_logprob_gap"] < 1e-4
    assert "## Example messages" in (out / "report.md").read_text()
    # Run again: every finished run is read back from its result.json, summarized the same way.
    again = run_llm_lab("theory", ["single", "vs_prob", "cotrain"], 2, out, quick=True, settings=QUICK, chat=talky_chat, log=lines.append)
    assert again["results"] == json.loads(json.dumps(results["results"]))
    # The same directory with other settings would mix two experiments.
    with pytest.raises(SettingsMismatch, match="lr"):
        run_llm_lab("theory", ["single"], 2, out, quick=True, settings=QUICK.replace(lr=0.5), chat=talky_chat)


def test_llm_settings_are_validated():
    with pytest.raises(ValueError, match="max_new_tokens"):
        LLMSettings(max_new_tokens=0)
    assert isinstance(QUICK, LLMSettings) and QUICK.steps == LLM_QUICK["steps"]


def test_scope_lab_llm_options_fail_clearly(tmp_path):
    from typer.testing import CliRunner

    from scope_marl.cli import app

    runner = CliRunner()
    config = tmp_path / "llm.yaml"
    config.write_text("steps: 3\nmax_new_token: 16\n")
    bad_key = runner.invoke(app, ["lab", "--policy", "llm", "--config", str(config), "--out", str(tmp_path / "a")])
    assert bad_key.exit_code == 2 and "max_new_token" in bad_key.output and "Traceback" not in bad_key.output
    table_quick = runner.invoke(app, ["lab", "--quick", "--out", str(tmp_path / "b")])
    assert table_quick.exit_code == 2 and "--policy llm" in table_quick.output
    unknown = runner.invoke(app, ["lab", "--policy", "transformer", "--out", str(tmp_path / "c")])
    assert unknown.exit_code == 2 and "table or llm" in unknown.output
    bad_arm = runner.invoke(app, ["lab", "--policy", "llm", "--arms", "single,nope", "--out", str(tmp_path / "d")])
    assert bad_arm.exit_code == 2 and "nope" in bad_arm.output


def test_unclear_turns_are_not_the_simulators_to_learn_from(talky_chat, game):
    """A co-trained user learns only from the turns it answered: the same dialogues with every
    message unclear leave its logits where they were, and the real ones move them."""
    reset_adapter(talky_chat, QUICK, seed=0)
    agent = LLMAgent(talky_chat, game, max_new_tokens=12)
    user = TrainableActs(FrozenActs.sharpened(game, 4.0, 0.0))
    turns = agent.batch(8, seed=1)
    d = play(game, turns, user, torch.tensor([0, 1]), 4, torch.Generator().manual_seed(2), unclear_act=agent.unclear_act)
    turns.close()
    assert d.user_turns.any() and (d.mask & ~d.user_turns).any()
    for dialogues, moves in ((replace(d, strategies=torch.full_like(d.strategies, -1)), False), (d, True)):
        before = user.logits.detach().clone()
        update_simulator(user, torch.optim.Adam([user.logits], lr=0.1), dialogues, QUICK)
        assert (not torch.equal(before, user.logits.detach())) == moves
