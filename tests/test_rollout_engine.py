"""The rollout engine: token-in-token-out streams, statuses, batching, groups, recorder."""

from __future__ import annotations

import pickle

import pandas as pd
import torch

from scope_marl.backends.scripted import ScriptedChatModel
from scope_marl.backends.seat import Seat
from scope_marl.config import RolloutConfig
from scope_marl.core.types import EpisodeStatus, SamplingParams
from scope_marl.envs import AGENT, USER, SayTheWord, role_view
from scope_marl.rollout import RolloutEngine, RolloutRecorder, read_episodes, summarize
from scope_marl.simulators import FrozenSimulator

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=64)


def engine_for(chat, env=None, simulator=None, trainable_user=False, **config):
    env = env or SayTheWord(num_tasks=4, max_exchanges=3)
    simulator = simulator or FrozenSimulator(chat, SAMPLING, simulator_id="frozen-tiny")
    if trainable_user and hasattr(simulator, "seat"):
        simulator.seat.trainable = True
    agent = Seat(model=chat, sampling=SAMPLING, trainable=True)
    config.setdefault("on_empty_reply", "keep")  # a random model's silent turns are not what these tests are about
    return RolloutEngine(env, agent, simulator, RolloutConfig(progress=False, **config))


def test_every_stream_is_on_policy_and_masks_only_its_own_sampled_tokens(talky_chat):
    engine = engine_for(talky_chat, trainable_user=True, group_size=2, seed=3)
    episodes = engine.run(engine.env.tasks("train"))
    multi_turn = [e for e in episodes if len(e.messages) >= 4]
    assert multi_turn, "need finished multi-turn episodes"
    checked = 0
    for episode in episodes:
        for role, stream in episode.streams.items():
            ids = torch.tensor([stream.prompt_ids + stream.response_ids])
            with torch.no_grad():
                logits = talky_chat.model(input_ids=ids).logits[0].float()
            logp = torch.log_softmax(logits / SAMPLING.temperature, -1)
            n = len(stream.prompt_ids)
            targets = ids[0, n:]
            recomputed = logp[n - 1 : -1].gather(-1, targets[:, None]).squeeze(-1)
            mask = torch.tensor(stream.loss_mask, dtype=torch.bool)
            diff = (recomputed[mask] - torch.tensor(stream.logprobs)[mask]).abs().max().item()
            assert diff < 1e-4, f"{episode.episode_id} {role}: rollout vs recomputed log-prob differ by {diff}"
            assert all(lp == 0.0 for lp, m in zip(stream.logprobs, stream.loss_mask) if not m)
            # The masked-in tokens are exactly this role's sampled turns, message by message.
            sampled_turns, current = [], []
            for tok, m in zip(stream.response_ids, stream.loss_mask):
                if m:
                    current.append(tok)
                elif current:
                    sampled_turns.append(current)
                    current = []
            if current:
                sampled_turns.append(current)
            own = [m.content for m in episode.messages if m.role == role]
            assert len(sampled_turns) == len(own)
            for toks, text in zip(sampled_turns, own):
                body = toks[:-1] if toks[-1] in talky_chat.stop_ids else toks
                assert talky_chat.decode(body) == text
            checked += 1
    assert checked >= 2 * len(multi_turn)


def test_stream_decodes_to_the_chat_template_of_the_final_messages(talky_chat):
    """Allowed glue: the stream stops at the role's last end-of-turn token, where the template
    continues with a newline (and with later messages of the other role)."""
    engine = engine_for(talky_chat, trainable_user=True, group_size=2, seed=11)
    episodes = [e for e in engine.run(engine.env.tasks("train")) if e.status == EpisodeStatus.COMPLETED]
    assert episodes
    for episode in episodes:
        task = next(t for t in engine.env.tasks("train") if t.task_id == episode.task_id)
        for role, stream in episode.streams.items():
            last_own = max(i for i, m in enumerate(episode.messages) if m.role == role)
            view = role_view(episode.messages[: last_own + 1], role, engine.env.system_prompt(task, role))
            expected = talky_chat.render_chat(view, add_generation_prompt=False)
            decoded = talky_chat.decode(stream.prompt_ids + stream.response_ids)
            assert decoded + "\n" == expected


def test_failed_and_truncated_episodes_are_recorded_as_such(talky_chat, tmp_path):
    # The simulator's backend raises for one episode's prompts only (found from a clean run with the
    # same seeds): that episode FAILED, the others play on exactly as without the failure.
    calm = FrozenSimulator(ScriptedChatModel(["hello there", "fine, thanks"]), simulator_id="scripted")
    clean = engine_for(talky_chat, simulator=calm, group_size=3, seed=0).run(SayTheWord(num_tasks=4, max_exchanges=3).tasks("train")[:1])
    marker = clean[1].messages[0].content
    assert marker not in (clean[0].messages[0].content, clean[2].messages[0].content)

    def replies(prompt):
        if any(m.content == marker for m in prompt):
            return RuntimeError("simulator backend down")
        return ["hello there", "fine, thanks"][sum(m.role == "assistant" for m in prompt) % 2]

    simulator = FrozenSimulator(ScriptedChatModel(replies), simulator_id="scripted")
    engine = engine_for(talky_chat, simulator=simulator, group_size=3, seed=0)
    episodes = engine.run(engine.env.tasks("train")[:1])
    statuses = [e.status for e in episodes]
    assert statuses.count(EpisodeStatus.FAILED) == 1 and episodes[1].status == EpisodeStatus.FAILED
    assert "simulator backend down" in episodes[1].error
    assert all(e.rewards == {} for e in episodes if e.status != EpisodeStatus.COMPLETED)

    # A 3-token limit on the agent truncates its first turn.
    short = Seat(model=talky_chat, sampling=SamplingParams(temperature=1.0, max_new_tokens=1), trainable=True)
    engine = RolloutEngine(SayTheWord(num_tasks=2), short, simulator, RolloutConfig(progress=False, group_size=2))
    truncated = [e for e in engine.run(engine.env.tasks("train")) if e.status == EpisodeStatus.TRUNCATED]
    assert truncated and all("token limit" in e.error for e in truncated)

    recorder = RolloutRecorder(tmp_path)
    path = recorder.write_batch(episodes + truncated)
    frame = pd.read_json(path, lines=True)
    assert set(frame["status"]) >= {"FAILED", "TRUNCATED"}
    assert [e.episode_id for e in read_episodes(path)] == list(frame["episode_id"])


def test_64_concurrent_episodes_complete_in_batches_with_groups_intact(talky_chat):
    env = SayTheWord(num_tasks=16, max_exchanges=2)
    engine = engine_for(talky_chat, env=env, trainable_user=True, group_size=4, max_concurrent=64, seed=1)
    before = talky_chat.steps_by_rows.copy()
    episodes = engine.run(env.tasks("train"))
    assert len(episodes) == 64
    assert all(e.status in (EpisodeStatus.COMPLETED, EpisodeStatus.TRUNCATED) for e in episodes)
    assert sum(e.status == EpisodeStatus.COMPLETED for e in episodes) >= 48
    groups = {}
    for e in episodes:
        groups.setdefault(e.group_id, []).append(e)
    assert len(groups) == 16 and all(len(g) == 4 for g in groups.values())
    assert all(len({e.task_id for e in g}) == 1 and len({e.simulator_id for e in g}) == 1 for g in groups.values())
    # Batching: both roles share the model and sampling, so one continuous batch carries all 64
    # episodes (every turn of either role joins it as soon as the other role has spoken).
    decoded = talky_chat.steps_by_rows - before
    steps, rows = decoded.total(), sum(live * n for live, n in decoded.items())
    assert engine.stats.model_calls >= steps and rows / steps >= 16
    summary = summarize(episodes, engine.stats.seconds, engine.stats.generated_tokens)
    assert summary["groups_with_one_simulator"] == 16 and summary["episodes"] == 64
    assert len(talky_chat.prefix_cache) == 0, "finished conversations release their cached states"


def test_reward_depends_on_what_is_said():
    env = SayTheWord(num_tasks=2, max_exchanges=2)
    word = env.tasks("train")[0].data["word"]
    agent = Seat(model=ScriptedChatModel([f"Please say {word}."]), trainable=False)
    yes = FrozenSimulator(ScriptedChatModel([f"Okay: {word.upper()}!"]), simulator_id="yes")
    no = FrozenSimulator(ScriptedChatModel(["No."]), simulator_id="no")
    task = env.tasks("train")[:1]
    said = RolloutEngine(env, agent, yes, RolloutConfig(progress=False, group_size=1)).run(task)[0]
    refused = RolloutEngine(env, agent, no, RolloutConfig(progress=False, group_size=1)).run(task)[0]
    assert said.rewards == {AGENT: 1.0, USER: 0.0} and len(said.messages) == 2
    assert refused.rewards == {AGENT: 0.0, USER: 1.0} and len(refused.messages) == 4


def test_simulator_sees_itself_as_assistant():
    env = SayTheWord(num_tasks=1, max_exchanges=2)
    user_model = ScriptedChatModel(["I am the user."])
    agent = Seat(model=ScriptedChatModel(["I am the agent."]))
    RolloutEngine(env, agent, FrozenSimulator(user_model), RolloutConfig(progress=False, group_size=1)).run(env.tasks())
    second = user_model.calls[1]
    assert [m.role for m in second] == ["system", "user", "assistant", "user"]
    assert second[2].content == "I am the user." and second[3].content == "I am the agent."
    assert "Never say" in second[0].content


def test_engine_pickles_with_its_models(talky_chat):
    engine = engine_for(talky_chat, group_size=1)
    clone = pickle.loads(pickle.dumps(engine))
    episodes = clone.run(clone.env.tasks("train")[:2])
    assert len(episodes) == 2


def test_same_seed_same_rollouts(talky_chat):
    a = engine_for(talky_chat, group_size=2, seed=5).run(SayTheWord(num_tasks=3).tasks())
    b = engine_for(talky_chat, group_size=2, seed=5).run(SayTheWord(num_tasks=3).tasks())
    assert [e.messages for e in a] == [e.messages for e in b]


def test_continue_on_turn_limit_keeps_playing_and_streams_stay_on_policy(talky_chat):
    short = SamplingParams(temperature=1.0, max_new_tokens=3)
    env = SayTheWord(num_tasks=2, max_exchanges=3)
    simulator = FrozenSimulator(talky_chat, short)
    simulator.seat.trainable = True
    engine = RolloutEngine(
        env,
        Seat(model=talky_chat, sampling=short, trainable=True),
        simulator,
        RolloutConfig(progress=False, group_size=2, on_turn_limit="continue", on_empty_reply="keep"),
    )
    episodes = engine.run(env.tasks())
    assert all(e.status == EpisodeStatus.COMPLETED for e in episodes)
    assert any(len(e.messages) == 6 for e in episodes)
    for e in episodes:
        for stream in e.streams.values():
            ids = torch.tensor([stream.prompt_ids + stream.response_ids])
            with torch.no_grad():
                logp = torch.log_softmax(talky_chat.model(input_ids=ids).logits[0], -1)
            n = len(stream.prompt_ids)
            recomputed = logp[n - 1 : -1].gather(-1, ids[0, n:, None]).squeeze(-1)
            mask = torch.tensor(stream.loss_mask, dtype=torch.bool)
            assert (recomputed[mask] - torch.tensor(stream.logprobs)[mask]).abs().max() < 1e-4
            # A cut turn gets the end-of-turn token as masked glue before the next message.
            assert stream.response_ids.count(talky_chat.eot_id) >= sum(1 for m in e.messages if m.role == stream.role) - 1


def test_each_row_draws_from_its_own_stream_whatever_its_neighbours(compiled_sampling):
    """Per-episode seeds at the sampler: row 0's draws depend on its logits and its own generator only."""
    from functools import partial

    from scope_marl.backends.sampling import sample_next

    sample_next = partial(sample_next, compiled=compiled_sampling)

    torch.manual_seed(0)
    logits = torch.randn(3, 50) * 3
    for top_p in (1.0, 0.8):
        params = SamplingParams(temperature=0.9, top_p=top_p)
        alone = [sample_next(logits[:1], params, [torch.Generator().manual_seed(7)])[0].item()]
        batched = [sample_next(logits, params, [torch.Generator().manual_seed(s) for s in (7, 8, 9)])[0][0].item()]
        gen_a, gen_b = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
        for _ in range(20):  # the same stream over many tokens, with and without neighbours
            alone.append(sample_next(logits[:1], params, [gen_a])[0].item())
            batched.append(sample_next(logits, params, [gen_b, torch.Generator().manual_seed(1), torch.Generator()])[0][0].item())
        assert alone == batched


def test_a_rollout_keeps_each_conversations_states_in_one_slot_for_all_its_turns(talky_chat, state_copies):
    """Both roles in one session: every turn after a conversation's first decodes in the slot its
    last turn left, so no states are put into a slot or copied out of one; the only copies are of
    identical opening prompts admitted together (prefilled once, copied to the others' slots), and
    ended episodes leave nothing behind."""
    env = SayTheWord(num_tasks=6, max_exchanges=3)
    engine = engine_for(talky_chat, env=env, group_size=1, max_concurrent=6, seed=2)
    hits = talky_chat.prefix_cache.hits
    episodes = engine.run(env.tasks("train"))
    turns = sum(len(e.messages) for e in episodes)
    assert turns >= 4 * len(episodes), "several turns per episode"
    assert talky_chat.prefix_cache.hits - hits > 0, "later turns reused their conversation's states"
    assert set(state_copies) <= {"copy"} and len(state_copies) < len(episodes)
    assert len(talky_chat.prefix_cache) == 0


def test_an_episode_samples_the_same_tokens_alone_or_beside_its_group(talky_chat):
    """Per-episode seeds in the engine: (run seed, group, rollout, turn) decide each draw, so rollouts of
    one group played together or one at a time, or numbered explicitly as another worker would, sample
    the same tokens. Their logits can differ in the last bits with the batch's composition (another
    row count changes the kernels' blocking), which on this random model's near-flat distributions
    flips a draw in about one run in four at T = 1 (measured over 20 seeds); at T = 0.5 none of 20
    flipped, so this test plays at T = 0.5."""
    sharp = SamplingParams(temperature=0.5, max_new_tokens=64)

    def engine_for(chat, **config):
        simulator = FrozenSimulator(chat, sharp, simulator_id="frozen-tiny")
        agent = Seat(model=chat, sampling=sharp, trainable=True)
        return RolloutEngine(
            SayTheWord(num_tasks=4, max_exchanges=3), agent, simulator, RolloutConfig(progress=False, on_empty_reply="keep", **config)
        )

    tasks = SayTheWord(num_tasks=4, max_exchanges=3).tasks("train")
    together = engine_for(talky_chat, group_size=2, seed=5, max_concurrent=2).run(tasks[2:3], first_group=2)
    one_by_one = engine_for(talky_chat, group_size=2, seed=5, max_concurrent=1).run(tasks[2:3], first_group=2)
    tokens = lambda e: [(r, s.response_ids) for r, s in sorted(e.streams.items())]
    assert [e.episode_id for e in together] == [e.episode_id for e in one_by_one] == ["say-train-2#2/0", "say-train-2#2/1"]
    assert [e.messages for e in together] == [e.messages for e in one_by_one]
    assert [tokens(e) for e in together] == [tokens(e) for e in one_by_one]
    reseeded = engine_for(talky_chat, group_size=2, seed=6, max_concurrent=2).run(tasks[2:3], first_group=2)
    assert [tokens(e) for e in reseeded] != [tokens(e) for e in together]


def test_a_decoding_step_that_raises_fails_only_the_turns_in_it_and_later_turns_decode_again(talky_chat, monkeypatch):
    """The model fails once mid-step: the turns in that session are FAILED with the error, episodes
    admitted later play in a fresh session, and the run returns every episode."""
    forward, calls = talky_chat.forward_step, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("out of memory in the decode step")
        return forward(*args, **kwargs)

    monkeypatch.setattr(talky_chat, "forward_step", flaky)
    simulator = FrozenSimulator(ScriptedChatModel(["sure", "why?"]), simulator_id="scripted")
    engine = engine_for(talky_chat, simulator=simulator, group_size=2, max_concurrent=2, seed=3)
    episodes = engine.run(engine.env.tasks("train")[:2])
    failed = [e for e in episodes if e.status == EpisodeStatus.FAILED]
    assert len(failed) == 2 and all("out of memory in the decode step" in e.error for e in failed)
    assert failed == episodes[:2], "the first two episodes were in the failing step"
    assert all(e.status != EpisodeStatus.FAILED and e.streams["agent"].num_sampled_tokens > 0 for e in episodes[2:])
    assert len(talky_chat.prefix_cache) == 0
