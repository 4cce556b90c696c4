"""The `scope` CLI and the scripted backend (no model weights needed)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from scope_marl.backends import BackendError, load_backend
from scope_marl.backends.scripted import ScriptedChatModel
from scope_marl.cli import app
from scope_marl.core.types import Message, SamplingParams

runner = CliRunner()
HELLO = [Message(role="user", content="hello")]


def test_scripted_replies_in_turn_and_records_prompts():
    chat = ScriptedChatModel(["one", "two"])
    outs = chat.generate([HELLO] * 3, SamplingParams())
    assert [o.text for o in outs] == ["one", "two", "one"]
    assert chat.calls == [HELLO] * 3


def test_scripted_function_stop_length_and_raise():
    chat = ScriptedChatModel(lambda prompt: f"you said {prompt[-1].content}. END more words here")
    sampling = SamplingParams(stop=["END"], max_new_tokens=50)
    assert chat.generate([HELLO], sampling)[0].text == "you said hello. "
    short = chat.generate([HELLO], SamplingParams(max_new_tokens=2))[0]
    assert (short.text, short.finish_reason) == ("you said", "length")
    broken = ScriptedChatModel([RuntimeError("backend down")])
    with pytest.raises(RuntimeError, match="backend down"):
        broken.generate([HELLO], SamplingParams())


def test_load_backend_rejects_unknown_spec_listing_the_forms():
    with pytest.raises(BackendError, match=r"unknown model spec 'gpt'.*embedded \| hf:PATH"):
        load_backend("gpt")
    with pytest.raises(BackendError, match="config.json missing"):
        load_backend("hf:/nonexistent/model")


def test_cli_generate_prints_replies_with_mean_logprob():
    result = runner.invoke(app, ["generate", "--model", "scripted:Sure, I will donate.|No thanks.", "--prompt", "Donate?", "--n", "2"])
    assert result.exit_code == 0, result.output
    assert "Sure, I will donate." in result.output and "No thanks." in result.output
    assert "mean log-prob" in result.output


def test_cli_bad_spec_is_a_clear_error_not_a_traceback():
    result = runner.invoke(app, ["generate", "--model", "gpt", "--prompt", "hi"])
    assert result.exit_code == 2
    assert "unknown model spec" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("command", [[], ["generate"]])
def test_help_has_an_example(command):
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0
    assert "Usage" in result.output
    if command:
        assert "Example: scope generate" in result.output
