"""Tool calls in the protocol: parsing, what each role sees, masks and log-probs in the streams,
malformed calls, caps, and episode files with and without tool fields."""

from __future__ import annotations

import json

import pytest
import torch

from scope_marl.backends.base import Generation
from scope_marl.backends.hf import HFChatModel
from scope_marl.backends.seat import Seat
from scope_marl.backends.tool_format import format_turn, parse_tool_calls, tool_chat
from scope_marl.config import RolloutConfig
from scope_marl.core.types import TOOL, Episode, EpisodeStatus, Message, SamplingParams, ToolCall
from scope_marl.envs import AGENT, USER, Environment, Task, role_view
from scope_marl.rollout import RolloutEngine
from scope_marl.simulators import FrozenSimulator

# ---- the Hermes text format -----------------------------------------------------------------------


def test_parse_reads_every_block_and_names_what_is_wrong_with_bad_ones():
    text = (
        'Let me check.\n<tool_call>\n{"name": "get_balance", "arguments": {"account": "A1"}}\n</tool_call>\n'
        '<tool_call>{"name": "x", "arguments": "{\\"k\\": 1}"}</tool_call>'
        "<tool_call>{not json}</tool_call><tool_call>[1]</tool_call>"
        '<tool_call>{"name": "y", "arguments": [1]}</tool_call><tool_call>{"name": "z"'
    )
    parsed = parse_tool_calls(text, "agent-3")
    assert parsed.content == "Let me check."
    assert parsed.calls == [
        ToolCall(id="agent-3-0", name="get_balance", arguments={"account": "A1"}),
        ToolCall(id="agent-3-1", name="x", arguments={"k": 1}),
    ]
    reasons = dict(parsed.malformed)
    assert list(reasons) == ["agent-3-2", "agent-3-3", "agent-3-4", "agent-3-5"]
    assert "not valid JSON" in reasons["agent-3-2"] and '"name"' in reasons["agent-3-3"]
    assert "arguments" in reasons["agent-3-4"] and "closing" in reasons["agent-3-5"]


def test_text_without_calls_is_left_alone_and_canonical_turns_parse_back():
    assert not parse_tool_calls("no calls here", "a").has_calls
    assert parse_tool_calls("no calls here", "a").content == "no calls here"
    calls = [ToolCall(id="a-0", name="f", arguments={"x": [1, "é"]}), ToolCall(id="a-1", name="g")]
    parsed = parse_tool_calls(format_turn("hi", calls), "a")
    assert parsed.content == "hi" and parsed.calls == calls and not parsed.malformed


def test_tool_chat_puts_schemas_in_the_system_prompt_and_results_in_one_user_turn():
    schema = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    view = [
        Message(role="system", content="Be helpful."),
        Message(role="user", content="hello"),
        Message(role="assistant", content="", tool_calls=[ToolCall(id="c-0", name="f")], raw='<tool_call>{"name":"f"}</tool_call>'),
        Message(role=TOOL, content="1", tool_call_id="c-0", requestor=AGENT),
        Message(role=TOOL, content="2", tool_call_id="c-1", requestor=AGENT),
    ]
    chat = tool_chat(view, [schema])
    assert chat[0].content.startswith("Be helpful.\n\n# Tools") and json.dumps(schema) in chat[0].content
    assert chat[2] == Message(role="assistant", content='<tool_call>{"name":"f"}</tool_call>')  # verbatim, as written
    assert chat[3] == Message(role="user", content="<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response>")
    assert len(chat) == 4


def test_each_role_sees_only_its_own_calls_and_results():
    messages = [
        Message(role=AGENT, content="Hi!"),
        Message(role=USER, content="", tool_calls=[ToolCall(id="u-0", name="phone")]),
        Message(role=TOOL, content="bars: 0", tool_call_id="u-0", requestor=USER),
        Message(role=USER, content="my phone has no signal"),
        Message(role=AGENT, content="", tool_calls=[], raw="<tool_call>oops</tool_call>"),
        Message(role=TOOL, content="Error: ...", tool_call_id="agent-4-0", requestor=AGENT, error=True),
        Message(role=AGENT, content="Let me fix that."),
    ]
    agent = role_view(messages, AGENT, "sys")
    assert [m.content for m in agent if m.role == "user"] == ["my phone has no signal"]
    assert [m.tool_call_id for m in agent if m.role == TOOL] == ["agent-4-0"]
    user = role_view(messages, USER, "sys")
    assert [m.content for m in user if m.role == "user"] == ["Hi!", "Let me fix that."]  # not the agent's failed call
    assert [m.tool_call_id for m in user if m.role == TOOL] == ["u-0"]


def test_episode_files_without_tool_fields_load_and_tool_fields_round_trip():
    old = '{"episode_id": "e", "task_id": "t", "group_id": "g", "simulator_id": "s", "messages": [{"role": "agent", "content": "hi"}]}'
    episode = Episode.model_validate_json(old)
    assert episode.tool_errors is None and episode.messages[0].tool_calls is None
    assert "tool" not in episode.model_dump_json()  # unset tool fields are not written
    call = ToolCall(id="agent-0-0", name="f", arguments={"a": 1})
    episode.messages += [
        Message(role=AGENT, content="", tool_calls=[call], raw="<tool_call>...</tool_call>"),
        Message(role=TOOL, content="ok", tool_call_id="agent-0-0", requestor=AGENT, error=False),
    ]
    episode.tool_errors = 0
    again = Episode.model_validate_json(episode.model_dump_json())
    assert again == episode and '"tool_errors":0' in episode.model_dump_json()


# ---- the engine with a tool environment -------------------------------------------------------------

BALANCE = {
    "type": "function",
    "function": {"name": "get_balance", "parameters": {"type": "object", "properties": {"account": {"type": "string"}}}},
}
PHONE = {"type": "function", "function": {"name": "check_phone", "parameters": {"type": "object", "properties": {}}}}


class Ledger(Environment):
    """A toy tool environment: the agent looks balances up, the user checks its phone."""

    name = "ledger"

    def tasks(self, split="train"):
        return [Task(task_id=f"t{i}", split=split, data={"balance": 10 * (i + 1)}) for i in range(2)]

    def system_prompt(self, task, role):
        return f"You are the {role}."

    def opening(self, task):
        return [Message(role=AGENT, content="Hi! How can I help you today?")]

    def first_speaker(self, task):
        return USER

    def tools(self, task, role):
        return [BALANCE] if role == AGENT else [PHONE]

    def start(self, task):
        return {"balance": task.data["balance"], "calls": []}

    def execute(self, task, state, role, call):
        state["calls"].append(call.name)
        if call.name == "explode":
            raise RuntimeError("boom")
        if call.name == "get_balance" and role == AGENT:
            return Message(role=TOOL, content=json.dumps({"balance": state["balance"]}), tool_call_id=call.id, requestor=role)
        if call.name == "check_phone" and role == USER:
            return Message(role=TOOL, content="bars: 4", tool_call_id=call.id, requestor=role)
        return Message(role=TOOL, content=f"Error: no tool {call.name}", tool_call_id=call.id, requestor=role, error=True)

    def is_done(self, task, messages):
        return "###STOP###" in messages[-1].content

    def rewards(self, task, messages):
        said = any(m.role == AGENT and str(task.data["balance"]) in m.content for m in messages)
        return {AGENT: float(said), USER: 0.0}


class TeacherForced(HFChatModel):
    """A real (tiny) model made to write scripted turns: the reply text is chosen by a function of the
    prompt and its tokens are scored by the model, so log-probs are the model's own for exactly those
    tokens in exactly that context. Stands in for a model that writes tool calls, which random weights
    cannot."""

    open_session = None  # no continuous batching: the engine calls generate_ids, which this fake replaces

    def __init__(self, model, tokenizer, script):
        super().__init__(model, tokenizer, name="forced", default_system_prompt="You are a test model.")
        self.script = script

    def generate_ids(self, prompt_ids, sampling, adapters=None, cache_keys=None, seeds=None) -> list[Generation]:
        out = []
        for ids in prompt_ids:
            text = self.script(self.decode(ids))
            reply = self.encode_text(text) + [self.eot_id]
            with torch.no_grad():  # the rows that predict the reply's tokens (log_softmax is per row: the same numbers)
                logits = self.model(input_ids=torch.tensor([list(ids) + reply])).logits[0, len(ids) - 1 : -1].float()
            logp = torch.log_softmax(logits / max(sampling.temperature, 1e-6), -1)
            chosen = logp.gather(-1, torch.tensor(reply)[:, None]).squeeze(-1)
            entropy = -(logp.exp() * logp).sum(-1)
            out.append(Generation(text=text, token_ids=reply, logprobs=chosen.tolist(), entropies=entropy.tolist(), prompt_ids=list(ids)))
        return out


def agent_script(prompt: str) -> str:
    turn = prompt.count("<|im_start|>assistant") - 1  # the generation prompt is one of them
    if turn == 1:
        return 'One moment.\n<tool_call>\n{"name": "get_balance", "arguments": {"account": "A1"}}\n</tool_call>'
    if turn == 2:
        return "<tool_call>{broken</tool_call>"
    balance = json.loads(prompt.rsplit('{"balance": ', 1)[1].split("}", 1)[0])
    return f"Your balance is {balance}."


def user_script(prompt: str) -> str:
    if "check_phone" in prompt and "<tool_response>" not in prompt:
        return '<tool_call>{"name": "check_phone", "arguments": {}}</tool_call>'
    return "Thanks. ###STOP###" if "balance is" in prompt else "What is my balance?"


SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=64)


def ledger_engine(make_tiny_model, tokenizer, **config) -> RolloutEngine:
    model = make_tiny_model()
    agent = Seat(model=TeacherForced(model, tokenizer, agent_script), sampling=SAMPLING, trainable=True)
    user = FrozenSimulator(TeacherForced(model, tokenizer, user_script), SAMPLING, simulator_id="forced-user")
    user.seat.trainable = True
    return RolloutEngine(Ledger(), agent, user, RolloutConfig(progress=False, group_size=2, **config))


def test_tool_calls_run_results_come_back_and_the_caller_goes_on(make_tiny_model, tokenizer):
    engine = ledger_engine(make_tiny_model, tokenizer)
    episodes = engine.run(engine.env.tasks())
    for episode, balance in zip(episodes, (10, 10, 20, 20)):
        assert episode.status == EpisodeStatus.COMPLETED, episode.error
        roles = [(m.role, m.requestor) for m in episode.messages]
        assert roles == [
            (AGENT, None),  # the fixed opening
            (USER, None),  # calls check_phone
            (TOOL, USER),
            (USER, None),  # "What is my balance?"
            (AGENT, None),  # calls get_balance
            (TOOL, AGENT),
            (AGENT, None),  # a malformed call
            (TOOL, AGENT),
            (AGENT, None),  # "Your balance is ..."
            (USER, None),  # ###STOP###
        ]
        m = episode.messages
        assert m[1].tool_calls == [ToolCall(id="user-1-0", name="check_phone")] and m[2].content == "bars: 4"
        assert m[4].content == "One moment." and m[4].tool_calls[0].arguments == {"account": "A1"}
        assert m[5].content == json.dumps({"balance": balance}) and m[5].tool_call_id == "agent-4-0" and not m[5].error
        assert m[6].tool_calls == [] and m[7].error and "not valid JSON" in m[7].content
        assert m[8].content == f"Your balance is {balance}." and episode.rewards[AGENT] == 1.0
        assert episode.tool_errors == 1


def assert_on_policy(episode, model, role: str, results: list[str]) -> None:
    """``role``'s stream: the model re-scores its sampled tokens to the recorded log-probs, the tool
    results in ``results`` are masked context, and the sampled text is exactly the role's own turns."""
    stream = episode.streams[role]
    ids = torch.tensor([stream.prompt_ids + stream.response_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model.model(input_ids=ids).logits[0].float(), -1)
    n = len(stream.prompt_ids)
    rescored = logp[n - 1 : -1].gather(-1, ids[0, n:, None]).squeeze(-1)
    mask = torch.tensor(stream.loss_mask, dtype=torch.bool)
    assert (rescored[mask] - torch.tensor(stream.logprobs)[mask]).abs().max() < 1e-4
    sampled = model.decode([t for t, k in zip(stream.response_ids, stream.loss_mask) if k])
    masked = model.decode([t for t, k in zip(stream.response_ids, stream.loss_mask) if not k])
    for text in results:
        assert text in masked and text not in sampled  # the tool's words are context, never trained on
    eos = model.decode([model.eot_id])
    assert sampled == "".join(f"{m.raw or m.content}{eos}" for m in episode.messages[1:] if m.role == role)


def test_tool_results_are_masked_and_streams_are_on_policy_in_both_roles(make_tiny_model, tokenizer):
    engine = ledger_engine(make_tiny_model, tokenizer)
    episode = engine.run(engine.env.tasks()[:1])[0]
    for role, results in ((AGENT, ['{"balance": 10}', "not valid JSON"]), (USER, ["bars: 4"])):
        assert_on_policy(episode, engine.agent.model, role, results)


def test_other_side_never_reads_a_call(make_tiny_model, tokenizer):
    engine = ledger_engine(make_tiny_model, tokenizer)
    episode = engine.run(engine.env.tasks()[:1])[0]
    decode = engine.agent.model.decode
    user_text = decode(episode.streams[USER].prompt_ids + episode.streams[USER].response_ids)
    agent_text = decode(episode.streams[AGENT].prompt_ids + episode.streams[AGENT].response_ids)
    for hidden in ("One moment.", "get_balance", "broken", '{"balance": 10}'):
        assert hidden not in user_text
    assert "Your balance is 10." in user_text
    for hidden in ("check_phone", "bars: 4"):
        assert hidden not in agent_text
    assert "What is my balance?" in agent_text


def test_caps_and_environment_failures_end_only_that_episode(make_tiny_model, tokenizer):
    engine = ledger_engine(make_tiny_model, tokenizer, max_tool_calls=1)
    episodes = engine.run(engine.env.tasks())
    assert {e.status for e in episodes} == {EpisodeStatus.TRUNCATED}
    assert all("max_tool_calls=1" in e.error for e in episodes)
    engine = ledger_engine(make_tiny_model, tokenizer, max_steps=4)
    assert all("max_steps=4" in e.error for e in engine.run(engine.env.tasks()))

    class Exploding(Ledger):
        def execute(self, task, state, role, call):
            if task.task_id == "t1":
                raise RuntimeError("the database is gone")
            return super().execute(task, state, role, call)

    engine = ledger_engine(make_tiny_model, tokenizer)
    engine.env = Exploding()
    statuses = [(e.task_id, e.status) for e in engine.run(engine.env.tasks())]
    assert statuses == [("t0", "COMPLETED")] * 2 + [("t1", "FAILED")] * 2


@pytest.mark.parametrize("tools", [[], [BALANCE]])
def test_environments_without_tools_record_no_tool_fields(tools, make_tiny_model, tokenizer):
    class Plain(Ledger):
        def tools(self, task, role):
            return tools if role == AGENT else []

    engine = ledger_engine(make_tiny_model, tokenizer)
    engine.env = Plain()
    episode = engine.run(engine.env.tasks()[:1])[0]
    assert (episode.tool_errors is None) == (not tools)


def test_a_prompt_past_the_context_ends_truncated_and_is_never_cut(make_tiny_model, tokenizer):
    class LongPolicy(Ledger):
        def system_prompt(self, task, role):
            return "Policy: " + "be kind. " * 1500 if role == AGENT else super().system_prompt(task, role)

    engine = ledger_engine(make_tiny_model, tokenizer)
    engine.env = LongPolicy()
    episodes = engine.run(engine.env.tasks())
    assert {e.status for e in episodes} == {EpisodeStatus.TRUNCATED}
    assert all(e.error.startswith("agent context is full") for e in episodes)
