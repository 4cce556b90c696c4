"""The scripted backend (scripted:...): replies in turn or from a function, stop strings, the length limit,
raised errors, and the prompts it was called with (formerly in tests/test_cli_and_scripted.py)."""

from __future__ import annotations

import pytest

from scope_marl.backends.scripted import ScriptedChatModel
from scope_marl.core.types import Message, SamplingParams

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
