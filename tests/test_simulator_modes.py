"""Simulator modes through the rollout engine: rotation, persona-guided, trainable, VS, population."""

from __future__ import annotations

import json

import pytest
import torch

from scope_marl.assembly import ModelCache, build_simulator
from scope_marl.backends.hf import HFChatModel
from scope_marl.backends.scripted import ScriptedChatModel
from scope_marl.backends.seat import Seat
from scope_marl.config import ConfigError, RolloutConfig, RolloutRunConfig, parse_simulator_spec
from scope_marl.core.types import EpisodeStatus, SamplingParams
from scope_marl.envs import AGENT, USER, SayTheWord
from scope_marl.rollout import RolloutEngine, summarize
from scope_marl.simulators import PERSONA_GUIDANCE, FrozenSimulator, Rotation, TrainableSimulator, persona_guided
from scope_marl.simulators.verbalized import VerbalizedSampling, json_schema, vs_metrics

AGENT_SEAT = Seat(model=ScriptedChatModel(["Say it, please."]))


def run(simulator, tasks=4, group_size=3, env=None, agent=AGENT_SEAT, **config):
    env = env or SayTheWord(num_tasks=tasks, max_exchanges=2)
    engine = RolloutEngine(env, agent, simulator, RolloutConfig(progress=False, group_size=group_size, **config))
    return engine.run(env.tasks())


def by_group(episodes):
    groups = {}
    for e in episodes:
        groups.setdefault(e.group_id, []).append(e)
    return groups


# ---- rotation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["round_robin", "random"])
def test_rotation_never_mixes_simulators_inside_a_group(order):
    members = [FrozenSimulator(ScriptedChatModel([f"I am {name}."]), simulator_id=name) for name in ("a", "b", "c")]
    episodes = run(Rotation(members, order=order, seed=1), tasks=9, group_size=4)
    groups = by_group(episodes)
    assert len(groups) == 9
    for group in groups.values():
        ids = {e.simulator_id for e in group}
        assert len(ids) == 1
        (sid,) = ids
        assert all(m.content == f"I am {sid}." for e in group for m in e.messages if m.role == USER)
        assert all(e.metadata["simulator"]["id"] == sid for e in group)
    used = [g[0].simulator_id for g in groups.values()]
    if order == "round_robin":
        assert used == ["a", "b", "c"] * 3
    else:
        assert set(used) == {"a", "b", "c"}
        assert used == [g[0].simulator_id for g in by_group(run(Rotation(members, order=order, seed=1), tasks=9, group_size=4)).values()]


def test_rotation_needs_distinct_members():
    same = FrozenSimulator(ScriptedChatModel(["x"]), simulator_id="same")
    with pytest.raises(ValueError, match="distinct simulator ids"):
        Rotation([same, same])


# ---- persona-guided -----------------------------------------------------------------------------


def test_persona_guided_prefixes_the_prompt_and_keeps_the_base():
    model = ScriptedChatModel(["whatever"])
    base = FrozenSimulator(model, prompt_prefix="Speak like a pirate.", simulator_id="base")
    guided = persona_guided(base)
    run(guided, tasks=1, group_size=1)
    system = model.calls[0][0].content
    assert system.startswith(PERSONA_GUIDANCE) and "Speak like a pirate." in system and "Never say" in system
    assert guided.simulator_id == "persona-guided:base" and base.seat.prompt_prefix == "Speak like a pirate."


def recompute_logprobs(chat, stream):
    """One forward pass over the stream with the adapter that generated it (None: adapters off)."""
    ids = torch.tensor([stream.prompt_ids + stream.response_ids])
    with torch.no_grad():
        if stream.adapter is None:
            with chat.model.disable_adapter():
                logits = chat.model(input_ids=ids).logits[0]
        else:
            chat.model.set_adapter(stream.adapter)
            logits = chat.model(input_ids=ids).logits[0]
    n = len(stream.prompt_ids)
    return torch.log_softmax(logits, -1)[n - 1 : -1].gather(-1, ids[0, n:, None]).squeeze(-1)


# ---- trainable ----------------------------------------------------------------------------------


def test_trainable_simulator_stream_is_on_policy_with_its_own_adapter(make_tiny_model, tokenizer):
    from peft import LoraConfig

    chat = HFChatModel(make_tiny_model(eot_bias=9.5), tokenizer, default_system_prompt="You are a test model.")
    torch.manual_seed(3)
    chat.add_adapter("simulator", LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    sampling = SamplingParams(temperature=1.0, max_new_tokens=48)
    agent = Seat(model=chat, sampling=sampling, trainable=True)
    episodes = run(TrainableSimulator(chat, sampling), tasks=3, group_size=2, agent=agent, seed=2)
    streams = [e.streams[USER] for e in episodes if USER in e.streams]
    assert streams and all(s.adapter == "simulator" for s in streams)
    assert all(e.streams[AGENT].adapter is None for e in episodes)
    for episode in episodes:
        for role, stream in episode.streams.items():
            got = recompute_logprobs(chat, stream)
            mask = torch.tensor(stream.loss_mask, dtype=torch.bool)
            assert (got[mask] - torch.tensor(stream.logprobs)[mask]).abs().max() < 1e-4, role
        if episode.status == EpisodeStatus.COMPLETED:
            assert episode.streams[USER].reward == episode.rewards[USER]


# ---- verbalized sampling ------------------------------------------------------------------------


def vs_json(items):
    return "Sure! ```json\n" + json.dumps({"responses": [{"text": t, "probability": p} for t, p in items]}) + "\n```"


def test_vs_draws_one_candidate_and_records_everything():
    model = ScriptedChatModel([vs_json([("Never!", 0.1), ("Fine: apple.", 0.9)])])
    vs = VerbalizedSampling(model, k=2, seed=0)
    episodes = run(vs, tasks=2, group_size=4)
    replies = [m.content for e in episodes for m in e.messages if m.role == USER]
    assert set(replies) <= {"Never!", "Fine: apple."} and "Fine: apple." in replies
    turn = episodes[0].metadata["simulator_turns"][0]
    assert turn["mode"] == "vs" and turn["fallback"] is False and len(turn["attempts"]) == 1
    assert [c["probability"] for c in turn["candidates"]] == pytest.approx([0.1, 0.9])
    assert turn["candidates"][turn["chosen"]]["text"] == episodes[0].messages[turn["message"]].content
    assert "JSON" in model.calls[0][0].content and '"probability"' in model.calls[0][0].content
    metrics = summarize(episodes, 1.0, 0, vs)["verbalized_sampling"]
    assert metrics["parse_success_rate"] == 1.0 and metrics["fallback_rate"] == 0.0 and metrics["mean_valid_k"] == 2.0


def test_vs_retries_then_falls_back_to_the_raw_text():
    model = ScriptedChatModel(["I refuse to write JSON."])
    vs = VerbalizedSampling(model, k=3, max_retries=2)
    episodes = run(vs, tasks=1, group_size=1)
    turn = episodes[0].metadata["simulator_turns"][0]
    assert turn["fallback"] is True and len(turn["attempts"]) == 3 and turn["candidates"] == []
    assert episodes[0].messages[1].content == "I refuse to write JSON."
    assert vs_metrics(episodes)["fallback_rate"] == 1.0 and vs_metrics(episodes)["parse_success_rate"] == 0.0


def test_vs_candidates_follow_environment_rules_p4g_tag():
    from scope_marl.envs.p4g.env import PersuasionForGood

    env = PersuasionForGood(source="synthetic", synthetic_tasks=20, max_exchanges=1)
    model = ScriptedChatModel([vs_json([("I'll give $1 to them.", 1.0)])])
    episodes = run(VerbalizedSampling(model, k=1), env=env, tasks=None, group_size=1)
    assert episodes[0].messages[1].content == "I'll give $1 to them. [DONATE $1.00]"
    assert episodes[0].rewards[AGENT] == 0.5


def test_vs_random_method_draws_uniformly_and_asks_for_texts_only():
    model = ScriptedChatModel([vs_json([("a", 0.99), ("b", 0.01)])])
    vs = VerbalizedSampling(model, k=2, method="random", seed=4)
    episodes = run(vs, tasks=4, group_size=8)
    first_replies = [e.messages[1].content for e in episodes]
    assert 8 <= first_replies.count("b") <= 24, "uniform draw despite the stated 0.99 / 0.01"
    assert '"probability"' not in model.calls[0][0].content.split("JSON only")[1]


def test_vs_multi_gathers_candidates_over_several_calls():
    model = ScriptedChatModel([vs_json([("one", 0.5), ("two", 0.5)]), vs_json([("three", 1.0)])])
    vs = VerbalizedSampling(model, k=3, variant="multi", calls=2)
    episodes = run(vs, tasks=1, group_size=1)
    turn = episodes[0].metadata["simulator_turns"][0]
    assert [c["text"] for c in turn["candidates"]] == ["one", "two", "three"] and len(turn["attempts"]) == 2
    assert "one | two" in model.calls[1][0].content, "the second call is told what was already said"


def test_vs_constrained_decoding_on_a_local_model_always_parses(talky_chat):
    vs = VerbalizedSampling(talky_chat, k=3, sampling=SamplingParams(temperature=1.0, max_new_tokens=12), seed=1)
    assert vs.constrained
    episodes = run(vs, tasks=4, group_size=2)
    turns = [t for e in episodes for t in e.metadata["simulator_turns"]]
    assert turns and all(not t["fallback"] for t in turns)
    assert all(len(t["candidates"]) >= 1 for t in turns)
    raw = turns[0]["attempts"][0]["raw"]
    assert json.loads(raw)["responses"], "the forced skeleton is valid JSON"
    assert len(talky_chat.prefix_cache) == 0


def test_vs_json_schema_for_servers_asks_exactly_k():
    schema = json_schema(5, "prob", "cot")["json_schema"]["schema"]
    array = schema["properties"]["responses"]
    assert array["minItems"] == array["maxItems"] == 5
    assert schema["required"] == ["reasoning", "responses"] and array["items"]["required"] == ["text", "probability"]
    assert json_schema(3, "random", "standard")["json_schema"]["schema"]["properties"]["responses"]["items"]["required"] == ["text"]


# ---- population ---------------------------------------------------------------------------------


def test_population_groups_face_one_distinct_pool_member(make_tiny_model, tokenizer, tmp_path):
    from peft import LoraConfig

    from scope_marl.simulators.pool import SimulatorPool
    from scope_marl.simulators.population import PopulationSimulator

    trainer_side = HFChatModel(make_tiny_model(eot_bias=9.5), tokenizer, default_system_prompt="You are a test model.")
    pool = SimulatorPool(tmp_path / "pool", max_size=3)
    for step, seed in ((0, 1), (16, 2)):
        torch.manual_seed(seed)
        name = f"snap{step}"
        trainer_side.add_adapter(name, LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
        trainer_side.model.save_pretrained(tmp_path / "out", selected_adapters=[name])
        pool.add(tmp_path / "out" / name, step=step, base=step == 0)
    served = HFChatModel(make_tiny_model(eot_bias=9.5), tokenizer, default_system_prompt="You are a test model.")
    population = PopulationSimulator(pool, served, SamplingParams(temperature=1.0, max_new_tokens=24), seed=0)
    episodes = run(population, tasks=6, group_size=2, agent=Seat(model=served, sampling=SamplingParams(max_new_tokens=24)))
    groups = by_group(episodes)
    member_ids = {m.member_id for m in pool.members}
    for group in groups.values():
        (sid,) = {e.simulator_id for e in group}
        assert sid.split("@")[0].removeprefix("pool:") in member_ids
    assert len({g[0].simulator_id for g in groups.values()}) == 2, "both members played some group"
    assert sorted(a for a in served.adapters) == sorted(f"pool-{m}" for m in member_ids)
    hashes = {m.content_hash for m in pool.members}
    assert len(hashes) == 2


# ---- config and spec strings --------------------------------------------------------------------


def test_every_mode_builds_from_yaml_config(talky_chat):
    cfg = RolloutRunConfig.model_validate(
        {
            "simulator": {
                "mode": "rotation",
                "members": [
                    {"mode": "frozen", "model": "scripted:hi", "id": "f"},
                    {"mode": "persona_guided", "model": "scripted:hi", "id": "p"},
                    {"mode": "vs", "model": "scripted:hi", "k": 3, "method": "random", "id": "v"},
                    {"mode": "trainable", "model": "scripted:hi", "id": "t"},
                ],
            },
        }
    )
    rotation = build_simulator(cfg.simulator, ModelCache())
    assert [m.simulator_id for m in rotation.members] == ["f", "p", "v", "t"]
    assert rotation.members[1].seat.prompt_prefix.startswith(PERSONA_GUIDANCE)
    assert rotation.members[2].k == 3 and rotation.members[3].seat.trainable and rotation.members[3].seat.adapter == "simulator"


def test_simulator_spec_strings():
    vs = parse_simulator_spec("vs(k=3,method=random,temperature=1.0):openai:gpt-4o-mini@http://127.0.0.1:9/v1")
    assert (vs.mode, vs.k, vs.method, vs.sampling.temperature, vs.model) == (
        "vs",
        3,
        "random",
        1.0,
        "openai:gpt-4o-mini@http://127.0.0.1:9/v1",
    )
    rotation = parse_simulator_spec("rotation:frozen:embedded; persona_guided:embedded ;vs:embedded")
    assert [m.mode for m in rotation.members] == ["frozen", "persona_guided", "vs"]
    assert parse_simulator_spec("pool:runs/x/pool").root == "runs/x/pool"
    for bad, needle in [("tau:embedded", "not understood"), ("vs(k=0):embedded", "k:"), ("vs(k):embedded", "key=value")]:
        with pytest.raises(ConfigError, match=needle):
            parse_simulator_spec(bad)
