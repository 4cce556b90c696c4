"""Persuasion for Good: corpus reading, split, personas, prompts, termination, rewards, rollouts."""

from __future__ import annotations

import hashlib
import random

import pytest

from scope_marl.backends.scripted import ScriptedChatModel
from scope_marl.backends.seat import Seat
from scope_marl.config import RolloutConfig
from scope_marl.core.types import EpisodeStatus, Message
from scope_marl.envs import AGENT, USER
from scope_marl.envs.p4g.corpus import find_corpus_dir, read_dialogues, read_participants
from scope_marl.envs.p4g.env import PersuasionForGood
from scope_marl.envs.p4g.personas import PersonaSampler, persona_text
from scope_marl.envs.p4g.split import check_disjoint, split_ids, stable_key
from scope_marl.rollout import RolloutEngine, RolloutRecorder
from scope_marl.simulators import FrozenSimulator

CORPUS = find_corpus_dir(required=False)
needs_corpus = pytest.mark.skipif(CORPUS is None, reason="P4G corpus not found (set SCOPE_P4G_DIR or place it at ../shared/data/p4g)")
# Digests of the test / validation split ids (one id per line, in split order). They pin the split
# across runs, machines and Python versions: a salted hash() or an unstable sort would change them.
TEST_SPLIT_SHA256 = "e8b87700f5530ca01f833e59337dbaf0cbbd2d497a8922a3ec599e46508b2d4a"
VALIDATION_SPLIT_SHA256 = "6eda333e5ddfadaef8b2d0c753d093efd4751c58c5dc07765f21efcd5dfef735"


def digest(ids) -> str:
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()


@pytest.fixture(scope="module")
def corpus_env():
    if CORPUS is None:
        pytest.skip("P4G corpus not found")
    return PersuasionForGood(source="corpus")


# ---- corpus ------------------------------------------------------------------------------------


@needs_corpus
def test_corpus_reads_1017_dialogues_with_alternating_messages():
    dialogues = read_dialogues(CORPUS)
    assert len(dialogues) == 1017
    first = next(iter(dialogues.values()))
    assert first[0] == Message(role=AGENT, content="Good morning. How are you doing today?")
    assert all(a.role != b.role for a, b in zip(first, first[1:]))
    assert len(read_dialogues(CORPUS, "300_dialog.csv")) == 300


# ---- split -------------------------------------------------------------------------------------


@needs_corpus
def test_split_is_disjoint_stratified_and_pinned_across_machines(corpus_env):
    ids = {name: [t.task_id for t in corpus_env.tasks(name)] for name in ("train", "validation", "test")}
    assert sum(map(len, ids.values())) == 1017
    assert not set(ids["train"]) & set(ids["test"]) and not set(ids["train"]) & set(ids["validation"])
    assert digest(ids["test"]) == TEST_SPLIT_SHA256
    assert digest(ids["validation"]) == VALIDATION_SPLIT_SHA256
    rate = {name: sum(t.data["human"]["persuadee_donation"] > 0 for t in corpus_env.tasks(name)) / len(ids[name]) for name in ids}
    assert abs(rate["train"] - rate["test"]) < 0.02 and abs(rate["train"] - rate["validation"]) < 0.02
    assert all(t.split == "test" for t in corpus_env.tasks("test"))
    again = PersuasionForGood(source="corpus")
    assert [t.task_id for t in again.tasks("test")] == ids["test"]


def test_split_of_ids_is_deterministic_and_uses_a_stable_hash():
    donated = {f"d{i}": i % 3 == 0 for i in range(200)}
    a, b = split_ids(donated), split_ids(dict(reversed(list(donated.items()))))
    assert a == b
    assert stable_key("20180904-045349_715_live") == hashlib.sha256(b"20180904-045349_715_live").hexdigest()
    assert [len(a[s]) for s in ("train", "validation", "test")] == [160, 20, 20]


def test_overlapping_splits_raise():
    with pytest.raises(ValueError, match="both the train and the test split"):
        check_disjoint({"train": ["a", "b"], "test": ["b"]})
    with pytest.raises(ValueError, match="summing to 1"):
        split_ids({"a": True}, (0.5, 0.5, 0.5))


# ---- personas ----------------------------------------------------------------------------------


@needs_corpus
def test_personas_render_for_every_participant_without_nan():
    people = [p for d in read_participants(CORPUS).values() for p in d.values()]
    assert len(people) == 2034
    incomplete = [p for p in people if len(p.survey) < 30]
    assert len(incomplete) >= 14, "the corpus has participants with empty survey cells"
    for p in people:
        text = persona_text(p.survey)
        assert text and "nan" not in text.lower() and "none" not in text.lower()
    empty = next(p for p in incomplete if not p.survey)
    assert persona_text(empty.survey) == "You are an ordinary adult."


def test_persona_words_follow_the_scores():
    calm = persona_text({"neurotic": 1.2, "agreeable": 4.9, "age": 34.0, "sex": "Female", "ideology": "Liberal"})
    assert "rarely anxious" in calm and "very agreeable" in calm and "34 years old" in calm and "a woman" in calm
    anxious = persona_text({"neurotic": 4.8, "agreeable": 1.1, "age": 3.0})
    assert "very often anxious" in anxious and "critical of others" in anxious
    assert "3 years" not in anxious, "impossible ages are left out"
    values = persona_text({"universalism": 6.0, "benevolence": 5.5, "care": 5.0, "power": 1.0, "hedonism": 2.0})
    assert "You care most about the welfare of all people" in values and "wealth and status" in values.split("care little")[1]


def test_persona_sampler_draws_from_marginals_deterministically():
    sampler = PersonaSampler()
    a = [sampler.sample(USER, random.Random(3)) for _ in range(2)]
    assert a[0] == a[1] and len(a[0]) > 20
    texts = {persona_text(sampler.sample(USER, random.Random(seed))) for seed in range(20)}
    assert len(texts) == 20, "different seeds give different personas"
    assert 0.4 < sampler.donation_rate() < 0.7


# ---- environment -------------------------------------------------------------------------------


def synthetic_env(**kw) -> PersuasionForGood:
    return PersuasionForGood(source="synthetic", synthetic_tasks=40, **kw)


def test_synthetic_environment_runs_without_the_corpus():
    env = synthetic_env()
    assert env.source == "synthetic" and env.describe()["split"]["sizes"] == {"train": 32, "validation": 4, "test": 4}
    ids = [t.task_id for t in env.tasks("train")]
    assert ids == [t.task_id for t in synthetic_env().tasks("train")]
    assert not set(ids) & {t.task_id for t in env.tasks("test")}


def test_prompts_carry_persona_payment_word_limit_and_tag_format():
    env = synthetic_env(word_limit=40)
    task = env.tasks()[0]
    persuader, persuadee = env.system_prompt(task, AGENT), env.system_prompt(task, USER)
    assert "Save the Children" in persuader and "specific amount" in persuader and "under 40 words" in persuader
    assert "$2" in persuadee and "[DONATE $N]" in persuadee and "do not give it away easily" in persuadee
    assert persona_text(task.data["persuadee"]) in persuadee and persona_text(task.data["persuader"]) in persuader
    assert env.first_speaker(task) == AGENT


def test_eager_ends_at_a_donation_tag_fixed_plays_all_exchanges():
    eager, fixed = synthetic_env(max_exchanges=5), synthetic_env(max_exchanges=5, termination="fixed")
    task = eager.tasks()[0]
    talk = [Message(role=AGENT, content="Would you give $1?"), Message(role=USER, content="Maybe, tell me more about $1.")]
    tagged = [*talk, Message(role=AGENT, content="It feeds a child."), Message(role=USER, content="OK. [DONATE $0.50]")]
    assert not eager.is_done(task, talk)
    assert eager.is_done(task, tagged) and not fixed.is_done(task, tagged)
    assert fixed.is_done(task, tagged * 3)


@pytest.mark.parametrize("mode,expected_user", [("adversarial", 0.75), ("cooperative", 0.25)])
def test_rewards_agent_gets_donation_over_two(mode, expected_user):
    env = synthetic_env(simulator_reward=mode)
    messages = [Message(role=AGENT, content="Could you give $1?"), Message(role=USER, content="I'll give [DONATE $0.50]")]
    assert env.rewards(env.tasks()[0], messages) == {AGENT: 0.25, USER: expected_user}
    above = [*messages[:1], Message(role=USER, content="[DONATE $5]")]
    assert env.rewards(env.tasks()[0], above)[AGENT] == 1.0, "donations are clamped to the $2 payment"


def test_p4g_rollout_records_personas_donations_and_rewards(tmp_path):
    env = synthetic_env(max_exchanges=3)
    agent = Seat(model=ScriptedChatModel(["Would you donate $1 to Save the Children?"]), trainable=False)

    # The persuadee hesitates at its first turn and gives at its second (it sees the agent as "user").
    def persuadee(chat):
        return "Hmm, I need that money." if sum(m.role == "user" for m in chat) == 1 else "Fine. [DONATE $0.75]"

    user = FrozenSimulator(ScriptedChatModel(persuadee), simulator_id="scripted-persuadee")
    engine = RolloutEngine(env, agent, user, RolloutConfig(progress=False, group_size=2))
    episodes = engine.run(env.tasks("train")[:4])
    assert [e.status for e in episodes] == [EpisodeStatus.COMPLETED] * 8
    first = episodes[0]
    assert len(first.messages) == 4 and first.messages[-1].content == "Fine. [DONATE $0.75]"
    assert first.rewards == {AGENT: 0.375, USER: 0.625}
    assert first.metadata["donation"] == 0.75 and first.metadata["stated_donations"] == [None, None, None, 0.75]
    assert first.metadata["persuadee_persona"] == persona_text(env.tasks("train")[0].data["persuadee"])
    path = RolloutRecorder(tmp_path).write_batch(episodes)
    assert "persuadee_persona" in path.read_text() and "[DONATE $0.75]" in path.read_text()


# ---- scope data p4g -------------------------------------------------------------------------------


def test_download_without_network_is_a_clear_error(tmp_path, monkeypatch):
    import socket

    from typer.testing import CliRunner

    from scope_marl.cli import app
    from scope_marl.envs.p4g import download

    with socket.socket() as s:  # a loopback port nobody listens on: the request fails at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(download, "SOURCE", f"http://127.0.0.1:{port}/data")
    result = CliRunner().invoke(app, ["data", "p4g", "--download", str(tmp_path / "p4g")])
    assert result.exit_code == 2
    assert "could not download" in result.output and "by hand" in result.output and "Traceback" not in result.output


@needs_corpus
def test_data_check_counts_the_corpus():
    from typer.testing import CliRunner

    from scope_marl.cli import app

    result = CliRunner().invoke(app, ["data", "p4g", "--check", str(CORPUS)])
    assert result.exit_code == 0, result.output
    assert "1017 dialogues" in result.output and "2034 participants" in result.output and "300 annotated" in result.output
