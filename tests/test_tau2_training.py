"""tau2-bench II: every simulator mode as the tau2 user, the simulator rewards (cooperative,
adversarial, the variance curriculum), malformed-call penalties, and training on retail with a
tiny model whose context holds tau2's 5,000-token agent prompt."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
import yaml

from scope_marl.core.types import TOOL, EpisodeStatus, Message
from scope_marl.envs.base import AGENT, USER

if importlib.util.find_spec("tau2") is None:
    pytest.skip("tau2-bench is not installed; `make setup` installs the tau2 extra", allow_module_level=True)

from scope_marl.backends.scripted import ScriptedChatModel
from scope_marl.backends.seat import Seat
from scope_marl.backends.tool_format import parse_call_notation
from scope_marl.config import RolloutConfig, TrainConfig, load_config
from scope_marl.config.loading import ConfigError
from scope_marl.envs.tau2 import Tau2
from scope_marl.envs.tau2.convert import from_tau2
from scope_marl.envs.tau2.env import curriculum_reward
from scope_marl.envs.tau2.trajectories import empty, gold
from scope_marl.evaluation.replay import replay
from scope_marl.experiment import start
from scope_marl.rollout import RolloutEngine
from scope_marl.simulators.verbalized import VerbalizedSampling
from scope_marl.training.losses import group_advantages


@pytest.fixture(scope="module")
def long_tiny_dir(tmp_path_factory, make_tiny_model, tokenizer):
    """The tiny Llama with an 8,192-token context (retail's agent prompt is about 5,100 tokens)."""
    from transformers import LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny-8k")
    model = make_tiny_model()
    model.config.max_position_embeddings = 8192
    plain = LlamaForCausalLM(model.config)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def tau2_config(model_dir, simulator: dict, **overrides) -> dict:
    base = {
        "model": f"hf:{model_dir}",
        "env": {"name": "tau2", "domain": "retail", "max_steps": 4},
        "agent_sampling": {"temperature": 1.0, "max_new_tokens": 8},
        "simulator": simulator,
        "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "learner": {"lr": 0.01, "kl_coef": 0.01},
        "rollout": {"group_size": 2, "max_concurrent": 8, "on_turn_limit": "continue", "progress": False},
        "tasks_per_step": 2,
        "steps": 2,
        "checkpoint_every": 2,
        "seed": 0,
        "threads": 1,
    }
    base.update(overrides)
    return base


def user_sim(model_dir, mode: str, **extra) -> dict:
    return {"mode": mode, "model": f"hf:{model_dir}", "sampling": {"temperature": 1.0, "max_new_tokens": 8}, **extra}


# ---- training on retail ---------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["frozen", "persona_guided", "vs", "trainable", "population"])
def test_a_rollout_and_two_training_steps_on_retail_train_tasks(long_tiny_dir, tmp_path, mode):
    extra = {"k": 2} if mode == "vs" else {}
    overrides = {}
    if mode in ("trainable", "population"):  # co-training, the user rewarded by the variance curriculum against a batch baseline
        overrides = {
            "trainable_roles": ["agent", "user"],
            "env": {"name": "tau2", "domain": "retail", "max_steps": 4, "simulator_reward": "curriculum"},
            "simulator_learner": {"lr": 0.01, "kl_coef": 0.01, "baseline": "batch"},
            **({"pool": {"every": 1, "max_size": 3}} if mode == "population" else {}),
        }
    sim_mode = "trainable" if mode == "population" else mode
    cfg = TrainConfig.model_validate(tau2_config(long_tiny_dir, user_sim(long_tiny_dir, sim_mode, **extra), **overrides))
    trainer = start(cfg, tmp_path / "run")
    records = trainer.run(progress=False)
    assert [r["step"] for r in records] == [1, 2]
    episodes = [json.loads(line) for f in sorted((tmp_path / "run" / "rollouts").glob("*.jsonl")) for line in f.read_text().splitlines()]
    train_ids = {t.task_id for t in Tau2("retail").tasks("train")}
    assert len(episodes) == 8 and {e["task_id"] for e in episodes} <= train_ids
    assert all(e["metadata"]["domain"] == "retail" for e in episodes)
    first = records[0]["train_agent"]
    assert first["episodes"] > 0 and first["logprob_gap"] < 1e-4 and first["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    if mode == "vs":
        turns = [t for e in episodes for t in e["metadata"].get("simulator_turns", [])]
        assert turns and all(t["mode"] == "vs" and t["k"] == 2 for t in turns)
        assert "verbalized_sampling" in records[0]["simulator"]
    if mode == "persona_guided":
        assert all(e["metadata"]["simulator"]["prompt_prefix"].startswith("Play a realistic, varied person") for e in episodes)
    if mode == "population":  # every group faces a member of the pool (the base snapshot, then step 1's)
        for step, record in enumerate(records):
            assert {e["simulator_id"] for e in episodes[4 * step : 4 * step + 4]} == {f"trainable:{record['pool_member']}"}
        assert len(list((tmp_path / "run" / "pool" / "members").iterdir())) >= 2
    if mode in ("trainable", "population"):
        user = records[0]["train_user"]
        # The user's stream is scored by the learner exactly as it was sampled (the agent's on-policy check).
        assert user["episodes"] > 0 and user["logprob_gap"] < 1e-4 and user["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
        # The tiny agent never succeeds, so every group's variance is 0 and its curriculum reward exp(-3.125).
        assert user["reward_mean"] == pytest.approx(curriculum_reward(0.0)) == pytest.approx(0.0439, abs=1e-4)
        streamed = [e for e in episodes if "user" in e["streams"]]
        assert streamed and all(e["streams"]["user"]["reward"] == pytest.approx(curriculum_reward(0.0)) for e in streamed)
        # Its stream carries its full prompt context: tau2's user guidelines and the task's scenario.
        from scope_marl.backends import load_backend

        text = load_backend(f"hf:{long_tiny_dir}").tokenizer.decode(streamed[0]["streams"]["user"]["prompt_ids"])
        assert "# User Simulation Guidelines" in text and "<scenario>" in text and "Hi! How can I help you today?" in text


@pytest.mark.integration
def test_rotation_keeps_one_user_per_group(long_tiny_dir, tmp_path):
    members = [user_sim(long_tiny_dir, "frozen", id=f"user-{i}", prompt_prefix=f"You are customer {i}.") for i in range(2)]
    cfg = TrainConfig.model_validate(tau2_config(long_tiny_dir, {"mode": "rotation", "members": members}, steps=1, task_ids=["10", "25"]))
    start(cfg, tmp_path / "run").run(progress=False)
    episodes = [json.loads(line) for f in (tmp_path / "run" / "rollouts").glob("*.jsonl") for line in f.read_text().splitlines()]
    by_group: dict[str, set] = {}
    for e in episodes:
        by_group.setdefault(e["group_id"], set()).add(e["simulator_id"])
    assert len(by_group) == 2 and all(len(ids) == 1 for ids in by_group.values())
    assert set().union(*by_group.values()) == {"user-0", "user-1"}
    assert {e["task_id"] for e in episodes} <= {"10", "25"}  # task_ids: a subset of the train split
    with pytest.raises(ValueError, match=r"task_ids \['nope'\] are not in the train split \(59 tasks"):
        start(cfg.model_copy(update={"task_ids": ["10", "nope"]}), tmp_path / "other")


def test_the_curriculum_needs_a_batch_baseline_for_the_trained_user(long_tiny_dir, tmp_path):
    cfg = tau2_config(
        long_tiny_dir,
        user_sim(long_tiny_dir, "trainable"),
        trainable_roles=["agent", "user"],
        env={"name": "tau2", "domain": "retail", "simulator_reward": "curriculum"},
    )
    path = tmp_path / "curriculum.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match="makes each simulator advantage exactly zero; set simulator_learner: \\{baseline: batch\\}"):
        load_config(path, TrainConfig)


# ---- simulator rewards ----------------------------------------------------------------------------------


@pytest.mark.integration
def test_simulator_rewards_and_the_curriculum_give_nonzero_advantages_against_the_batch():
    """Two groups on retail task 33, played by replay: one where the agent succeeds once in two, one where
    it never does. The curriculum is one number per group (1.0 and 0.044): a group baseline cancels it,
    the batch baseline does not."""
    env = Tau2("retail", simulator_reward="curriculum")
    t = next(x for x in env.tasks("test") if x.task_id == "33")
    tau2_task = env.task_of(t)
    won, lost = from_tau2(gold("retail", tau2_task).messages), from_tau2(empty(tau2_task).messages)
    episodes = []
    for group, plays in (("33#0", (won, lost)), ("33#1", (lost, lost))):
        for r, messages in enumerate(plays):
            e = replay(env, t, messages)
            episodes.append(e.model_copy(update={"group_id": group, "episode_id": f"{group}/{r}"}))
    assert [e.metadata["tau2_reward"] for e in episodes] == [1.0, 0.0, 0.0, 0.0]
    env.group_rewards(t, episodes[:2])
    env.group_rewards(t, episodes[2:])
    user = torch.tensor([e.rewards[USER] for e in episodes])
    assert user.tolist() == pytest.approx([1.0, 1.0, curriculum_reward(0.0), curriculum_reward(0.0)])
    assert episodes[0].metadata["curriculum"]["success_variance"] == pytest.approx(0.25)
    groups = [e.group_id for e in episodes]
    assert group_advantages(user, groups).abs().max() == 0.0  # the reference release's zero advantage
    batch = group_advantages(user, groups, baseline="batch")
    assert (batch.abs() > 0.4).all() and batch[0] > 0 > batch[2]
    for mode, expected in (("cooperative", [1.0, 0.0]), ("adversarial", [0.0, 1.0])):
        other = Tau2("retail", simulator_reward=mode)
        assert [replay(other, t, m).rewards[USER] for m in (won, lost)] == expected


def test_each_role_pays_for_its_own_malformed_calls_capped_at_the_reward_range():
    env = Tau2("telecom")
    t = env.tasks("train")[0]
    bad_user = Message(role=USER, content="", tool_calls=[], raw="<tool_call>{oops</tool_call>")
    error = Message(role=TOOL, content="Error: the call is not valid JSON", tool_call_id="user-1-0", requestor=USER, error=True)
    messages = [*env.opening(t), bad_user, error, Message(role=USER, content="###STOP###")]
    assert env.penalty(messages, USER) == pytest.approx(0.1) and env.penalty(messages, AGENT) == 0.0
    many = [*env.opening(t), *[bad_user, error] * 12, Message(role=USER, content="###STOP###")]
    assert env.penalty(many, USER) == 1.0  # 12 x 0.1, capped at tau2's reward range
    assert Tau2("telecom", malformed_call_penalty=0.0).penalty(many, USER) == 0.0


# ---- Verbalized Sampling with tools ---------------------------------------------------------------------


def test_call_notation_reads_calls_of_known_tools_only():
    tools = Tau2("telecom").tools(Tau2("telecom").tasks("train")[0], USER)
    assert parse_call_notation("toggle_airplane_mode()", tools) == ("toggle_airplane_mode", {})
    assert parse_call_notation("set_network_mode_preference(mode=4g_5g_preferred)", tools) == (
        "set_network_mode_preference",
        {"mode": "4g_5g_preferred"},
    )
    assert parse_call_notation("`check_app_status(messaging)`", tools) == ("check_app_status", {"app_name": "messaging"})
    assert parse_call_notation("grant_app_permission(app_name=messaging, permission='sms')", tools)[1] == {
        "app_name": "messaging",
        "permission": "sms",
    }
    assert parse_call_notation("launch_rocket()", tools) is None  # not one of the user's tools
    assert parse_call_notation("My phone (the new one) has no signal.", tools) is None


def test_a_vs_user_in_telecom_draws_a_device_call_that_executes_and_alone_enters_the_history():
    env = Tau2("telecom", max_steps=6)
    t = env.tasks("train")[0]
    candidates = {
        "responses": [
            {"text": "toggle_airplane_mode()", "probability": 0.98},
            {"text": "My phone has no service, can you help?", "probability": 0.01},
            {"text": "###STOP###", "probability": 0.01},
        ]
    }
    sim_model = ScriptedChatModel([json.dumps(candidates)])
    vs = VerbalizedSampling(sim_model, k=3, method="prob", constrained=False, seed=0, simulator_id="vs-user")
    agent = Seat(model=ScriptedChatModel(["Please check your phone."]), trainable=False)
    engine = RolloutEngine(env, agent, vs, RolloutConfig(group_size=1, progress=False, on_turn_limit="continue"))
    (episode,) = engine.run([t])
    assert episode.status == EpisodeStatus.COMPLETED
    call = next(m for m in episode.messages if m.role == USER and m.tool_calls)
    assert [c.name for c in call.tool_calls] == ["toggle_airplane_mode"]
    result = episode.messages[episode.messages.index(call) + 1]
    assert result.role == TOOL and result.requestor == USER and not result.error
    turn = episode.metadata["simulator_turns"][0]
    assert turn["candidates"][0]["call"] == "toggle_airplane_mode" and "call" not in turn["candidates"][1]
    assert turn["chosen"] == 0
    said = " ".join(m.content + (m.raw or "") for m in episode.messages)
    assert "no service" not in said  # candidates that were not drawn never enter the history
    prompt = sim_model.calls[0][0].content
    assert "tool_name(argument=value, ...)" in prompt and "check_status_bar()" in prompt
