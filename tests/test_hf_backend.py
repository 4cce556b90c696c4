"""The transformers backend: log-prob definition, batching, sampling controls, LoRA adapters."""

from __future__ import annotations

import copy

import pytest
import torch

from scope_marl.backends.base import BackendError, SamplingParams
from scope_marl.backends.hf import HFChatModel
from scope_marl.core.types import Message

PROMPTS = [
    [Message(role="user", content="Hi")],
    [Message(role="user", content="Tell me, in some detail, why anyone would give money to a charity at all?")],
    [Message(role="system", content="Be brief."), Message(role="user", content="Donate?")],
]


def reference_scores(model, prompt_ids, sampled_ids, temperature):
    """Log-probs and entropies of ``sampled_ids`` from one plain, unpadded forward pass."""
    ids = torch.tensor([list(prompt_ids) + list(sampled_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    chosen = logp.gather(-1, torch.tensor(sampled_ids)[:, None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return chosen, entropy


@pytest.mark.parametrize("temperature,top_p", [(0.7, 0.9), (1.3, 1.0)])
def test_logprobs_match_plain_forward_for_left_padded_batch(tiny_chat, temperature, top_p):
    sampling = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=24, seed=1)
    outs = tiny_chat.generate(PROMPTS, sampling)
    lengths = {len(o.prompt_ids) for o in outs}
    assert len(lengths) == 3, "prompts must differ in length so the batch is really left-padded"
    for out in outs:
        assert len(out.token_ids) == len(out.logprobs) == len(out.entropies) > 0
        ref_lp, ref_ent = reference_scores(tiny_chat.model, out.prompt_ids, out.token_ids, temperature)
        assert torch.allclose(torch.tensor(out.logprobs), ref_lp, atol=1e-4, rtol=0)
        assert torch.allclose(torch.tensor(out.entropies), ref_ent, atol=1e-4, rtol=0)


def test_greedy_batch_equals_one_prompt_at_a_time(tiny_chat):
    sampling = SamplingParams(temperature=0.0, max_new_tokens=16)
    batched = tiny_chat.generate(PROMPTS, sampling)
    for prompt, out in zip(PROMPTS, batched):
        alone = tiny_chat.generate([prompt], sampling)[0]
        assert alone.token_ids == out.token_ids
        assert alone.logprobs == pytest.approx(out.logprobs, abs=1e-4)


def test_greedy_matches_transformers_generate(tiny_chat):
    prompt_ids = tiny_chat.encode_chat(PROMPTS[1])
    ours = tiny_chat.generate_ids([prompt_ids], SamplingParams(temperature=0.0, max_new_tokens=12))[0]
    with torch.no_grad():
        theirs = tiny_chat.model.generate(
            torch.tensor([prompt_ids]), max_new_tokens=12, do_sample=False, eos_token_id=list(tiny_chat.stop_ids)
        )[0, len(prompt_ids) :].tolist()
    assert ours.token_ids == theirs


def test_same_seed_same_sample_and_different_seed_differs(tiny_chat):
    a = tiny_chat.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=20, seed=7))
    b = tiny_chat.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=20, seed=7))
    c = tiny_chat.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=20, seed=8))
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.token_ids for o in a] != [o.token_ids for o in c]


def test_decode_steps_count_the_columns_each_row_attends_over(tiny_chat):
    """The rollout bench's roofline reads the KV cache bytes off these counts."""
    prompt_ids = tiny_chat.encode_chat(PROMPTS[1])
    steps, columns = tiny_chat.steps_by_rows.copy(), tiny_chat.columns_by_rows.copy()
    out = tiny_chat.generate_ids([prompt_ids], SamplingParams(temperature=0.0, max_new_tokens=9))[0]
    n = len(out.token_ids)
    assert n > 2
    # The first token comes from the prefill; each later one from a decode step fed the previous
    # token at column len(prompt) + i, which sees columns [0, len(prompt) + i].
    assert (tiny_chat.steps_by_rows - steps) == {1: n - 1}
    assert (tiny_chat.columns_by_rows - columns) == {1: sum(len(prompt_ids) + i + 1 for i in range(n - 1))}


def test_max_new_tokens_and_finish_reason(tiny_chat):
    outs = tiny_chat.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=5, seed=0))
    for out in outs:
        assert len(out.token_ids) <= 5
        ended_on_eot = out.token_ids[-1] in tiny_chat.stop_ids
        assert out.finish_reason == ("stop" if ended_on_eot else "length")
        assert len(out.token_ids) == 5 or ended_on_eot


def test_stop_string_cuts_text_and_ends_generation(tiny_chat):
    sampling = SamplingParams(temperature=1.0, max_new_tokens=30, seed=0)
    free = tiny_chat.generate([PROMPTS[0]], sampling)[0]
    assert len(free.text) > 4, "the tiny model should babble something we can stop on"
    stop = free.text[2:4]
    cut = tiny_chat.generate([PROMPTS[0]], sampling.model_copy(update={"stop": [stop]}))[0]
    assert stop not in cut.text
    assert free.text.startswith(cut.text)
    assert cut.finish_reason == "stop"
    assert len(cut.token_ids) < len(free.token_ids)
    assert cut.token_ids == free.token_ids[: len(cut.token_ids)], "ids are the sampled ones, stop string included"


def test_prompt_longer_than_context_is_a_clear_error(make_tiny_model, tokenizer):
    model = make_tiny_model()
    model.config.max_position_embeddings = 8
    chat = HFChatModel(model, tokenizer)
    with pytest.raises(BackendError, match="context"):
        chat.generate_ids([list(range(1, 20))], SamplingParams(max_new_tokens=4))


def test_explicit_system_prompt_replaces_template_default(tiny_chat, tokenizer):
    text = tokenizer.decode(tiny_chat.encode_chat([Message(role="user", content="Hi")]))
    assert "You are a test model." in text and "SmolLM" not in text


# ---- LoRA ------------------------------------------------------------------------------------


def lora_config(seed: int):
    from peft import LoraConfig

    torch.manual_seed(seed)
    # init_lora_weights=False: random B as well as A, so a fresh adapter really changes outputs.
    return LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False)


@pytest.fixture
def lora_chat(make_tiny_model, tokenizer):
    chat = HFChatModel(make_tiny_model(), tokenizer, default_system_prompt="You are a test model.")
    base_copy = copy.deepcopy(chat.model)
    chat.add_adapter("agent", lora_config(1))
    chat.add_adapter("user", lora_config(2))
    return chat, HFChatModel(base_copy, tokenizer, default_system_prompt="You are a test model.")


def test_two_adapters_differ_in_one_mixed_batch_and_disabled_equals_base(lora_chat):
    chat, base = lora_chat
    assert sorted(chat.adapters) == ["agent", "user"]
    prompt = PROMPTS[1]
    sampling = SamplingParams(temperature=0.0, max_new_tokens=12)
    agent, user, none = chat.generate([prompt] * 3, sampling, adapters=["agent", "user", None])
    reference = base.generate([prompt], sampling)[0]
    # Greedy ids of a random tiny model are often all newlines; the distributions still tell.
    gap = max(abs(a - u) for a, u in zip(agent.logprobs, user.logprobs))
    assert gap > 1e-2, "two different adapters must give different next-token distributions"
    assert max(abs(a - r) for a, r in zip(agent.logprobs, reference.logprobs)) > 1e-2
    assert none.token_ids == reference.token_ids
    assert none.logprobs == pytest.approx(reference.logprobs, abs=1e-5)
    # A mixed batch gives what each adapter gives alone.
    alone = chat.generate([prompt], sampling, adapters=["agent"])[0]
    assert alone.token_ids == agent.token_ids
    assert alone.logprobs == pytest.approx(agent.logprobs, abs=1e-4)


def test_adapter_logprobs_match_forward_with_that_adapter(lora_chat):
    chat, _ = lora_chat
    out = chat.generate([PROMPTS[0]], SamplingParams(temperature=0.8, max_new_tokens=10, seed=3), adapters=["user"])[0]
    chat.model.set_adapter("user")
    ref_lp, _ = reference_scores(chat.model, out.prompt_ids, out.token_ids, 0.8)
    assert torch.allclose(torch.tensor(out.logprobs), ref_lp, atol=1e-4, rtol=0)


def test_a_prefill_and_a_decoding_row_of_other_adapters_share_a_step_with_their_own_weights(lora_chat):
    """One packed step carries a row decoding under one adapter and another prompt prefilling
    under a second: each token goes through its own adapter, so both equal their solo runs."""
    chat, _ = lora_chat
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8)
    first, second = chat.encode_chat(PROMPTS[1]), chat.encode_chat(PROMPTS[2])
    session = chat.open_session(sampling)
    session.add(first, adapter="agent", seed=1, tag="agent")
    session.step()  # the agent's prompt is in; its first token is sampled next step
    session.add(second, adapter="user", seed=2, tag="user")
    run = session._run
    shared = []
    session._run = lambda decode, chunks, *rest: shared.append(bool(decode and chunks)) or run(decode, chunks, *rest)
    out = dict(iter_until_done(session))
    assert shared[0], "the user's prefill ran in the same forward as the agent's decoding"
    for tag, prompt, seed in (("agent", first, 1), ("user", second, 2)):
        alone = chat.generate_ids([prompt], sampling, adapters=[tag], seeds=[seed])[0]
        assert out[tag].token_ids == alone.token_ids
        assert out[tag].logprobs == pytest.approx(alone.logprobs, abs=1e-5)


def test_unknown_adapter_is_a_clear_error(lora_chat):
    chat, _ = lora_chat
    with pytest.raises(BackendError, match="unknown LoRA adapter.*add_adapter"):
        chat.generate([PROMPTS[0]], SamplingParams(max_new_tokens=2), adapters=["simulator"])


def test_saved_adapter_reloads_with_same_outputs(lora_chat, tmp_path, make_tiny_model, tokenizer):
    chat, _ = lora_chat
    chat.model.save_pretrained(tmp_path, selected_adapters=["agent"])
    fresh = HFChatModel(make_tiny_model(), tokenizer, default_system_prompt="You are a test model.")
    fresh.add_adapter("agent", tmp_path / "agent" if (tmp_path / "agent").exists() else tmp_path)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=10)
    a = chat.generate([PROMPTS[2]], sampling, adapters=["agent"])[0]
    b = fresh.generate([PROMPTS[2]], sampling, adapters=["agent"])[0]
    assert a.token_ids == b.token_ids


# ---- prefix (KV) reuse across turns ------------------------------------------------------------


def test_prefix_cache_reuse_gives_same_tokens_and_logprobs_as_full_prefill(tiny_chat, tokenizer):
    sampling = SamplingParams(temperature=0.9, max_new_tokens=12, seed=5)
    first_prompts = [tiny_chat.encode_chat(p) for p in PROMPTS]
    keys = [("episode", i) for i in range(len(PROMPTS))]
    first = tiny_chat.generate_ids(first_prompts, sampling, cache_keys=keys)
    assert len(tiny_chat.prefix_cache) == 3
    reply = tokenizer.encode("\n<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    second_prompts = [p + o.token_ids + reply for p, o in zip(first_prompts, first)]
    misses_before = tiny_chat.prefix_cache.misses
    cached = tiny_chat.generate_ids(second_prompts, sampling, cache_keys=keys)
    prefilled = tiny_chat.prefix_cache.misses - misses_before
    assert prefilled == sum(len(reply) + 1 for _ in PROMPTS), "only the last sampled token and the reply are prefilled"
    tiny_chat.release(keys)
    assert len(tiny_chat.prefix_cache) == 0
    plain = tiny_chat.generate_ids(second_prompts, sampling)
    for a, b in zip(cached, plain):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        ref_lp, _ = reference_scores(tiny_chat.model, a.prompt_ids, a.token_ids, 0.9)
        assert torch.allclose(torch.tensor(a.logprobs), ref_lp, atol=1e-4, rtol=0)


def test_a_long_opening_shared_by_new_conversations_is_prefilled_once_with_the_same_samples(tiny_chat, monkeypatch):
    import random

    from scope_marl.backends import decode_session

    rng = random.Random(0)
    opening = [rng.randrange(1000, 40000) for _ in range(400)]
    prompts = [opening + [rng.randrange(1000, 40000) for _ in range(6 + i)] for i in range(3)]
    keys = [("episode", i) for i in range(3)]
    seeds = [11, 12, 13]
    sampling = SamplingParams(temperature=0.9, max_new_tokens=8)
    shared = tiny_chat.generate_ids(prompts, sampling, cache_keys=keys, seeds=seeds)
    # The opening (its last token is left to each row) once, then each row's own tail.
    assert tiny_chat.prefix_cache.misses == 400 + sum(len(p) - 400 for p in prompts)
    other = [rng.randrange(1000, 40000) for _ in range(300)]
    tiny_chat.generate_ids([other + [5], other + [6]], sampling, cache_keys=[("other", 0), ("other", 1)], seeds=[1, 2])
    misses = tiny_chat.prefix_cache.misses
    later = tiny_chat.generate_ids([opening + [7, 8, 9]], sampling, cache_keys=[("episode", 9)], seeds=[14])[0]
    assert tiny_chat.prefix_cache.misses == misses + 3, "a later conversation starts from the shared opening too"
    tiny_chat.release([*keys, ("episode", 9), ("other", 0), ("other", 1)])
    tiny_chat.prefix_cache.clear()
    monkeypatch.setattr(decode_session, "MIN_SHARED_PREFIX", 10_000)
    alone = tiny_chat.generate_ids([*prompts, opening + [7, 8, 9]], sampling, seeds=[*seeds, 14])
    for a, b in zip([*shared, later], alone):
        assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


@pytest.mark.parametrize("compiled_attention", [True, False], ids=["op", "sdpa"])
def test_a_conversations_next_turn_decodes_in_the_slot_its_last_turn_left_without_copying_states(
    tiny_chat, tokenizer, state_copies, compiled_attention, request
):
    """KV in place across turns: in one session a keyed turn's states stay parked in its slot; the
    conversation's next turn takes that same slot, prefills only what is new, copies no states, and
    samples what a full prefill of the whole prompt samples (with either decode attention)."""
    if compiled_attention:
        request.getfixturevalue("rows_attention_op")
    tiny_chat.compiled_attention = compiled_attention
    copies = state_copies
    sampling = SamplingParams(temperature=0.9, max_new_tokens=12)
    session = tiny_chat.open_session(sampling)
    prompts = [tiny_chat.encode_chat(p) for p in PROMPTS]
    keys = [("episode", i) for i in range(len(PROMPTS))]
    for i, prompt in enumerate(prompts):
        session.add(prompt, key=keys[i], seed=i, tag=i)
    first = dict(iter_until_done(session))
    parked = {key: entry.slot for key, entry in session.parked.values()}
    assert sorted(parked) == keys and len(set(parked.values())) == 3
    reply = tokenizer.encode("\n<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    second_prompts = [p + first[i].token_ids + reply for i, p in enumerate(prompts)]
    misses = tiny_chat.prefix_cache.misses
    for i, prompt in enumerate(second_prompts):
        session.add(prompt, key=keys[i], seed=10 + i, tag=i)
    session.step()  # admission
    assert {row.key: row.slot for row in session.slots if row is not None} == parked, "each turn took its own slot"
    second = dict(iter_until_done(session))
    assert tiny_chat.prefix_cache.misses - misses == sum(len(reply) + 1 for _ in PROMPTS)
    assert copies == [], "no states were copied between the turns"
    assert {key: entry.slot for key, entry in session.parked.values()} == parked
    tiny_chat.release(keys)
    for i, prompt in enumerate(second_prompts):
        alone = solo(tiny_chat, prompt, sampling, 10 + i)
        assert second[i].token_ids == alone.token_ids
        assert second[i].logprobs == pytest.approx(alone.logprobs, abs=1e-5)


def test_parked_turns_are_spilled_to_copies_when_slots_run_out_and_freed_when_released(tiny_chat, state_copies):
    """One live row and one parked slot: a third conversation spills the longest-parked turn into a
    copy in the prefix cache; that conversation's next turn copies it back and samples as a full
    prefill does; a released conversation's slot is free at the next admission; close() leaves only copies."""
    from scope_marl.backends.decode_session import DecodeSession
    from scope_marl.backends.prefix_cache import CachedPrefix, SlotPrefix

    copies = state_copies
    sampling = SamplingParams(temperature=0.9, max_new_tokens=6)
    cache = tiny_chat.prefix_cache
    session = DecodeSession(tiny_chat, sampling, max_rows=1, max_parked=1)
    prompts = {key: list(range(300 + 7 * n, 320 + 7 * n)) for n, key in enumerate("abc")}
    out = {}
    for key in "ab":
        session.add(prompts[key], key=key, seed=1, tag=key)
        out.update(iter_until_done(session))
    assert isinstance(cache.get("a"), SlotPrefix) and isinstance(cache.get("b"), SlotPrefix) and copies == []
    session.add(prompts["c"], key="c", seed=1, tag="c")
    out.update(iter_until_done(session))
    assert copies == ["states"] and isinstance(cache.get("a"), CachedPrefix), "the longest-parked turn was spilled"
    follow_up = prompts["a"] + out["a"].token_ids + [401, 402]
    session.add(follow_up, key="a", seed=2, tag="a2")
    again = dict(iter_until_done(session))["a2"]
    assert copies == ["states", "states", "put"], "b spilled to make room, a's copy put back in"
    assert {key: entry.slot for key, entry in session.parked.values()} == {"c": 0, "a": 1}
    tiny_chat.release(["c"])
    session.add([5, 6, 7], tag="free")
    session.step()
    assert session.slots[0].tag == "free" and len(copies) == 3, "the released conversation's slot was reused, nothing spilled"
    assert [key for key, _ in session.parked.values()] == ["a"]
    list(iter_until_done(session))
    session.close()
    assert session.parked == {} and all(isinstance(cache.get(k), CachedPrefix) for k in ("a", "b"))
    tiny_chat.release(["a", "b"])
    alone = solo(tiny_chat, follow_up, sampling, 2)
    assert again.token_ids == alone.token_ids and again.logprobs == pytest.approx(alone.logprobs, abs=1e-5)


def test_prefix_cache_ignores_entries_of_another_adapter(lora_chat):
    chat, _ = lora_chat
    prompt = chat.encode_chat(PROMPTS[0])
    sampling = SamplingParams(temperature=0.0, max_new_tokens=4)
    chat.generate_ids([prompt], sampling, adapters=["agent"], cache_keys=["k"])
    hits = chat.prefix_cache.hits
    other = chat.generate_ids([prompt + [42]], sampling, adapters=["user"], cache_keys=["k"])[0]
    assert chat.prefix_cache.hits == hits
    alone = chat.generate_ids([prompt + [42]], sampling, adapters=["user"])[0]
    assert other.logprobs == pytest.approx(alone.logprobs, abs=1e-4)


# ---- sampling -----------------------------------------------------------------------------------


def test_top_p_samples_only_the_nucleus_in_proportion(compiled_sampling):
    from functools import partial

    from scope_marl.backends.sampling import sample_next

    sample_next = partial(sample_next, compiled=compiled_sampling)

    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(20000, 4).contiguous()
    g = torch.Generator().manual_seed(0)
    ids, logprobs, entropy = sample_next(logits, SamplingParams(temperature=1.0, top_p=0.7), g)
    counts = torch.bincount(ids, minlength=4).float() / len(ids)
    assert counts[2] == 0 and counts[3] == 0, "tokens outside the 0.7 nucleus are never drawn"
    assert counts[0].item() == pytest.approx(0.5 / 0.8, abs=0.015)
    # Log-probs and entropy are those of the full distribution, not of the nucleus.
    assert torch.allclose(logprobs, probs.log()[ids])
    assert entropy[0].item() == pytest.approx(-(probs * probs.log()).sum().item(), abs=1e-6)
    full, _, _ = sample_next(logits, SamplingParams(temperature=1.0, top_p=1.0), g)
    assert torch.allclose(torch.bincount(full, minlength=4).float() / len(full), probs, atol=0.015)


def test_the_tail_floor_moves_no_draw_and_no_drawable_log_prob(monkeypatch, compiled_sampling):
    """Logits spread so that at T=0.5 many tokens sit below e^-87 (subnormal exps): flooring the
    tail at TAIL_FLOOR_NATS draws the same tokens with the same log-probs and entropies as no floor."""
    from scope_marl.backends import sampling

    torch.manual_seed(0)
    logits = torch.randn(64, 5000) * 12
    params = SamplingParams(temperature=0.5, top_p=0.95)
    assert (torch.log_softmax(logits / 0.5, -1) < -87).float().mean() > 0.05, "the case needs a subnormal-deep tail"

    def draw():
        return sampling.sample_next(logits, params, [torch.Generator().manual_seed(i) for i in range(64)], compiled_sampling)

    ids, logprobs, entropy = draw()
    monkeypatch.setattr(sampling, "TAIL_FLOOR_NATS", float("inf"))
    ref_ids, ref_logprobs, ref_entropy = draw()
    assert torch.equal(ids, ref_ids)
    assert torch.allclose(logprobs, ref_logprobs, atol=1e-6, rtol=0) and torch.allclose(entropy, ref_entropy, atol=1e-6, rtol=0)


def test_nucleus_falls_back_to_a_full_sort_when_candidates_are_short(monkeypatch):
    from scope_marl.backends import sampling as hf

    monkeypatch.setattr(hf, "NUCLEUS_CANDIDATES", 2)
    probs = torch.tensor([0.3, 0.3, 0.2, 0.2])
    logits, params = probs.log().expand(4000, 4).contiguous(), SamplingParams(top_p=0.75)
    ids, _, _ = hf.sample_next(logits, params, torch.Generator().manual_seed(1), compiled=False)  # (the torch path's candidates)
    counts = torch.bincount(ids, minlength=4).float() / len(ids)
    assert counts[2] > 0.2 or counts[3] > 0.2, "the third token is inside the 0.75 nucleus"
    assert (counts > 0).sum() == 3


@pytest.mark.parametrize(("temperature", "top_p"), [(0.7, 0.95), (1.0, 1.0), (0.3, 0.5), (1.0, 0.9)])
def test_the_compiled_sampler_draws_what_the_torch_path_draws(sample_rows_op, temperature, top_p):
    """Rows shaped like a real LM's (a few likely tokens over a long tail) and one whose nucleus needs
    tokens 9 nats below the best (past the op's narrower candidate levels): the same ids for the same
    uniform numbers, and log-probs and entropies within float error of a float64 computation (the
    op sums in double; torch's float log_softmax is ~1e-5 off here)."""
    from scope_marl.backends.sampling import TAIL_FLOOR_NATS, sample_next

    torch.manual_seed(0)
    logits = torch.randn(48, 49152) * 3
    logits[:, :40] += torch.linspace(14, 6, 40)
    logits[-1] = -9.0
    logits[-1, 7] = 0.0  # one token, then 49,151 tokens 9 nats down that hold 86% of the mass
    params = SamplingParams(temperature=temperature, top_p=top_p)
    torch_path = sample_next(logits, params, [torch.Generator().manual_seed(i) for i in range(48)], compiled=False)
    compiled = sample_next(logits, params, [torch.Generator().manual_seed(i) for i in range(48)], compiled=True)
    assert torch.equal(compiled[0], torch_path[0])
    scaled = logits.double() / temperature
    exact = torch.log_softmax(scaled.clamp(min=scaled.amax(-1, keepdim=True) - TAIL_FLOOR_NATS), -1)
    assert (compiled[1] - exact.gather(-1, compiled[0][:, None]).squeeze(-1)).abs().max() < 2e-6
    assert (compiled[2] - -(exact.exp() * exact).sum(-1)).abs().max() < 2e-6


def solo(chat, prompt, sampling, seed, adapter=None):
    return chat.generate_ids([prompt], sampling, [adapter] if adapter else None, seeds=[seed])[0]


@pytest.mark.parametrize("compiled_attention", [True, False], ids=["op", "sdpa"])
def test_continuous_batching_refills_a_finished_rows_slot_and_every_row_matches_its_solo_run(talky_chat, compiled_attention, request):
    """Two slots, six prompts of growing length: a waiting prompt joins as soon as a row finishes
    (while the other row is mid-reply), the slot cache grows for the longer prompts (and, with
    SDPA's decode attention, compacts as rows drain), and every generation equals that prompt
    generated alone (same seed)."""
    if compiled_attention:
        request.getfixturevalue("rows_attention_op")
    talky_chat.compiled_attention = compiled_attention
    import random

    rng = random.Random(3)
    prompts = [[rng.randrange(200, 20000) for _ in range(n)] for n in (5, 9, 40, 120, 300, 700)]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=40)
    session = talky_chat.open_session(sampling)
    session.max_rows = 2
    for i, prompt in enumerate(prompts):
        session.add(prompt, seed=100 + i, tag=i)
    joined, left, out, step = {}, {}, {}, 0
    while session.busy:
        for i, gen in session.step():
            out[i], left[i] = gen, step
            joined.setdefault(i, step)
        for row in session.slots:
            if row is not None:
                joined.setdefault(row.tag, step)
        assert sum(r is not None for r in session.slots) <= 2
        step += 1
    assert sorted(out) == list(range(6))
    assert any(joined[a] < joined[b] < left[a] for a in out for b in out), "a prompt joined while another row was decoding"
    assert session.cache.columns >= 700 + 40
    for i, prompt in enumerate(prompts):
        alone = solo(talky_chat, prompt, sampling, 100 + i)
        assert out[i].token_ids == alone.token_ids
        assert out[i].logprobs == pytest.approx(alone.logprobs, abs=1e-5)
        ref_lp, _ = reference_scores(talky_chat.model, prompt, out[i].token_ids, 1.0)
        assert torch.allclose(torch.tensor(out[i].logprobs), ref_lp, atol=1e-4, rtol=0)


def test_a_long_prompt_is_prefilled_in_chunks_with_the_same_samples(tiny_chat, monkeypatch):
    from scope_marl.backends import decode_session

    prompt = list(range(300, 350))
    sampling = SamplingParams(temperature=0.8, max_new_tokens=10)
    whole = solo(tiny_chat, prompt, sampling, 7)
    chunks = []
    run = decode_session.DecodeSession._run
    monkeypatch.setattr(decode_session, "PREFILL_BUDGET", 16)
    monkeypatch.setattr(
        decode_session.DecodeSession, "_run", lambda self, decode, parts, *rest: chunks.extend(parts) or run(self, decode, parts, *rest)
    )
    chunked = solo(tiny_chat, prompt, sampling, 7)
    assert [(start, count) for _, start, count in chunks] == [(0, 16), (16, 16), (32, 16), (48, 2)], (
        "chunks of at most 16 tokens, each appended to the states its slot holds"
    )
    assert chunked.token_ids == whole.token_ids
    assert chunked.logprobs == pytest.approx(whole.logprobs, abs=1e-5)


def test_a_session_refuses_bad_prompts_one_by_one(tiny_chat):
    session = tiny_chat.open_session(SamplingParams(max_new_tokens=4))
    with pytest.raises(BackendError, match="empty prompt"):
        session.add([])
    with pytest.raises(BackendError, match="fills the model's"):
        session.add([5] * tiny_chat.context_length)
    with pytest.raises(BackendError, match=r"unknown LoRA adapter\(s\) \['nope'\]"):
        session.add([5, 6], adapter="nope")
    session.add([5, 6], tag="ok")
    assert session.tags == ["ok"]
    assert [tag for tag, _ in iter_until_done(session)] == ["ok"]


def iter_until_done(session):
    while session.busy:
        yield from session.step()
