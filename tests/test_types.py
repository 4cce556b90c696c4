"""Core types: the Episode JSON form round-trips and misaligned streams are rejected."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from scope_marl.core.types import Episode, EpisodeStatus, Message, RoleStream


def make_episode() -> Episode:
    stream = RoleStream(
        role="agent",
        prompt_ids=[1, 2, 3],
        response_ids=[10, 11, 2, 7, 8, 12],
        loss_mask=[1, 1, 1, 0, 0, 1],
        logprobs=[-0.5, -1.0, -0.1, 0.0, 0.0, -2.0],
        entropies=[1.0, 2.0, 0.5, 0.0, 0.0, 3.0],
        adapter="agent",
        reward=0.25,
    )
    return Episode(
        episode_id="t1-g0-r1",
        task_id="t1",
        group_id="t1-g0",
        simulator_id="frozen:embedded",
        messages=[Message(role="agent", content="Would you give $1?"), Message(role="user", content="[DONATE $0.50]")],
        streams={"agent": stream},
        rewards={"agent": 0.25, "user": 0.75},
        status=EpisodeStatus.TRUNCATED,
        metadata={"persona": "very agreeable"},
        timings={"generate_s": 0.42},
    )


def test_episode_json_round_trip_keeps_every_field():
    episode = make_episode()
    text = episode.model_dump_json()
    data = json.loads(text)
    assert data["status"] == "TRUNCATED"
    assert data["streams"]["agent"]["loss_mask"] == [1, 1, 1, 0, 0, 1]
    assert data["messages"][1] == {"role": "user", "content": "[DONATE $0.50]"}
    assert Episode.model_validate_json(text) == episode


def test_sampled_token_count_comes_from_the_mask():
    assert make_episode().streams["agent"].num_sampled_tokens == 4


def test_misaligned_stream_is_rejected_with_the_field_named():
    with pytest.raises(ValidationError, match="logprobs has 1 items but response_ids has 2"):
        RoleStream(role="agent", prompt_ids=[1], response_ids=[5, 6], loss_mask=[1, 1], logprobs=[0.0], entropies=[0.0, 0.0])


def test_unknown_status_is_rejected():
    with pytest.raises(ValidationError):
        Episode(episode_id="e", task_id="t", group_id="g", simulator_id="s", status="DONE")
