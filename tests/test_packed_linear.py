"""Pre-packed linear weights for sampling: same numbers as torch's path, never stale after an update."""

from __future__ import annotations

import gc
import pickle

import pytest
import torch
import torch.nn.functional as F

from scope_marl.backends.base import SamplingParams
from scope_marl.backends.packed_linear import ROW_BUCKETS, PackedLinears, PackedWeights, packing_available, row_bucket
from scope_marl.backends.prefix_cache import CachedPrefix
from tests.test_hf_backend import reference_scores

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN packed linear")


@pytest.mark.parametrize("shape", [(1, 96), (46, 96), (5, 1, 96)])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_torch_in_float32(shape, bias):
    torch.manual_seed(0)
    weight, x = torch.randn(200, 96), torch.randn(*shape)
    b = torch.randn(200) if bias else None
    packed = PackedWeights(always=True)
    with torch.inference_mode(), PackedLinears(packed):
        out = F.linear(x, weight, b)
    assert len(packed) == 1, "the weight was packed (the packed path ran)"
    assert out.shape == (*shape[:-1], 200)
    torch.testing.assert_close(out, F.linear(x, weight, b), atol=2e-4, rtol=1e-5)


def test_a_weight_changed_in_place_is_packed_again():
    torch.manual_seed(0)
    layer = torch.nn.Linear(96, 64)
    packed = PackedWeights(always=True)
    x = torch.randn(8, 96)
    with torch.inference_mode(), PackedLinears(packed):
        before = layer(x)
    with torch.no_grad():
        layer.weight.mul_(-2.0)  # what an optimizer step does: same tensor, new values
    with torch.inference_mode(), PackedLinears(packed):
        after = layer(x)
    torch.testing.assert_close(after, layer(x).detach(), atol=2e-4, rtol=1e-5)
    assert not torch.allclose(before, after)


def test_a_weight_that_goes_takes_its_pack_with_it():
    packed = PackedWeights(always=True)
    layer = torch.nn.Linear(32, 16)
    with torch.inference_mode(), PackedLinears(packed):
        layer(torch.randn(2, 32))
    assert len(packed) == 1
    del layer
    assert len(packed) == 0


def test_other_dtypes_take_torchs_own_path():
    weight, x = torch.randn(16, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)
    packed = PackedWeights(always=True)
    with PackedLinears(packed):
        out = F.linear(x, weight)
    assert len(packed) == 0 and torch.equal(out, F.linear(x, weight))


def test_sampling_after_a_weight_update_scores_under_the_new_weights(tiny_chat):
    """A learner sharing the model updates it in place between rollouts: the sampler's log-probs
    must be those of the new weights (the on-policy definition), not of a stale packed copy."""
    tiny_chat.packed = PackedWeights(always=True)  # whatever calibration would choose here
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, seed=3)
    prompt = [[5, 6, 7, 8, 9]]
    tiny_chat.generate_ids(prompt, sampling)
    assert len(tiny_chat.packed) > 0, "sampling ran on packed weights"
    with torch.no_grad():
        for p in tiny_chat.model.model.layers[0].mlp.parameters():
            p.mul_(3.0)
    out = tiny_chat.generate_ids(prompt, sampling)[0]
    ref_lp, _ = reference_scores(tiny_chat.model, prompt[0], out.token_ids, 1.0)
    assert torch.allclose(torch.tensor(out.logprobs), ref_lp, atol=1e-4, rtol=0)
    clone = pickle.loads(pickle.dumps(tiny_chat))  # a Ray worker's copy: packs are remade there
    assert clone.packed is not None and len(clone.packed) == 0


def test_calibration_routes_each_call_by_its_row_count(tmp_path, monkeypatch):
    """Calibration records a choice per row bucket; a call takes the packed path only where that
    choice says packed is faster at its row count."""
    torch.manual_seed(0)
    big = torch.randn(200, 96)
    packed = PackedWeights()
    assert not packed.calibrated and not packed.use_packed(8)
    monkeypatch.setenv("SCOPE_CACHE", str(tmp_path))
    packed.calibrate([big, torch.randn(16, 96)])
    assert packed.calibrated and len(packed.faster) == len(ROW_BUCKETS)
    assert [row_bucket(r) for r in (1, 2, 3, 8, 20, 30, 64, 500)] == [0, 0, 1, 1, 1, 2, 2, 2]
    packed.faster = tuple(rows <= 8 for rows in ROW_BUCKETS)  # as if it paid up to 8 rows
    assert [packed.use_packed(r) for r in (1, 8, 20, 64)] == [True, True, True, False]
    with torch.inference_mode(), PackedLinears(packed):
        for rows in (30, 64, 500):
            torch.testing.assert_close(F.linear(x := torch.randn(rows, 96), big), x @ big.T, atol=2e-4, rtol=1e-5)
        assert len(packed) == 0, "no call so far had the packed choice"
        torch.testing.assert_close(F.linear(x := torch.randn(4, 96), big), x @ big.T, atol=2e-4, rtol=1e-5)
        assert len(packed) == 1, "4 rows: packed"


def test_the_choice_is_stored_per_machine_so_every_process_takes_the_same_path(tmp_path, monkeypatch):
    """The first calibration on a machine measures and stores its choice; a later process (here: a
    fresh in-process memo) reads the stored choice instead of timing again, so a Ray actor, a
    torchrun rank or a resumed run samples through the same kernels."""
    import json

    import scope_marl.backends.packed_linear as pl

    monkeypatch.setenv("SCOPE_CACHE", str(tmp_path))
    monkeypatch.setattr(pl, "_MEASURED", {})
    weights = [torch.randn(200, 96), torch.randn(16, 96)]
    first = PackedWeights()
    first.calibrate(weights)
    table = json.loads((tmp_path / pl.CHOICES_FILE).read_text())
    (key,) = table
    assert tuple(table[key]) == first.faster
    table[key] = [not v for v in table[key]]  # as if another process had measured the opposite
    (tmp_path / pl.CHOICES_FILE).write_text(json.dumps(table))
    monkeypatch.setattr(pl, "_MEASURED", {})  # a new process: nothing in memory
    later = PackedWeights()
    later.calibrate(weights)
    assert later.faster == tuple(not v for v in first.faster), "the stored choice wins over a new timing"


def test_an_unwritable_cache_still_calibrates_and_says_what_to_fix(tmp_path, monkeypatch):
    import scope_marl.backends.packed_linear as pl

    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("SCOPE_CACHE", str(blocker))
    monkeypatch.setattr(pl, "_MEASURED", {})
    packed = PackedWeights()
    with pytest.warns(UserWarning, match=r"SCOPE_CACHE"):
        packed.calibrate([torch.randn(200, 96)])
    assert packed.calibrated and len(packed.faster) == len(ROW_BUCKETS)


def test_a_chat_calibrates_once_when_it_opens_a_session(tiny_chat):
    assert not tiny_chat.packed.calibrated
    tiny_chat.generate_ids([[5, 6, 7]], SamplingParams(temperature=1.0, max_new_tokens=2, seed=1))
    assert tiny_chat.packed.calibrated and len(tiny_chat.packed.faster) == len(ROW_BUCKETS)


def test_packed_modules_route_a_models_linears_as_the_mode_does_and_leave_them_as_they_were(make_tiny_model):
    """The sampler's steps route only the model's nn.Linear layers (not every torch call): the
    same numbers as the F.linear mode, and afterwards the modules are untouched (pickle, train)."""
    from scope_marl.backends.packed_linear import PackedModules

    model = make_tiny_model().eval()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.inference_mode(), PackedLinears(PackedWeights(always=True)):
        by_mode = model(input_ids=ids).logits
    weights = PackedWeights(always=True)
    with torch.inference_mode(), PackedModules(weights, model):
        by_modules = model(input_ids=ids).logits
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    assert len(weights) == len({id(m.weight) for m in linears}), "every linear ran on its packed weight"
    assert torch.equal(by_modules, by_mode)
    assert all("forward" not in m.__dict__ for m in linears)
    with torch.inference_mode():
        torch.testing.assert_close(pickle.loads(pickle.dumps(model))(input_ids=ids).logits, model(input_ids=ids).logits)


def test_the_steps_routing_follows_the_adapters_and_the_packed_weights(tiny_chat):
    """The model's linears are found once and kept; an adapter added later (new LoRA linears) or a
    new set of packed weights is routed from the next step on."""
    from peft import LoraConfig

    tiny_chat.packed = PackedWeights(always=True)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=4, seed=3)
    tiny_chat.generate_ids([[5, 6, 7]], sampling)
    before = len(tiny_chat.packed)
    tiny_chat.add_adapter("late", LoraConfig(r=4, target_modules=["q_proj"]))
    tiny_chat.generate_ids([[5, 6, 7]], sampling, adapters=["late"])
    layers = tiny_chat.model.config.num_hidden_layers
    assert len(tiny_chat.packed) == before + 2 * layers, "each layer's lora_A and lora_B ran packed"
    tiny_chat.packed = PackedWeights(always=True)
    tiny_chat.generate_ids([[5, 6, 7]], sampling, adapters=["late"])
    assert len(tiny_chat.packed) == before + 2 * layers, "the new weights object did the packing"


def test_an_adapter_removed_and_added_again_under_its_name_is_routed_and_sampled_like_a_fresh_one(tiny_chat, make_tiny_model, tokenizer):
    """The LLM lab gives every run a fresh adapter under the same name (remove, then add). The new
    LoRA linears must be routed like the first adapter's, the deleted ones dropped, and the states
    cached with the old adapter forgotten: a run after a run samples bit for bit what a run in a fresh
    process samples (the routing was once found only when the adapter names changed, so the second
    run's LoRA went through torch's kernels, a last-bits difference that training then grew)."""
    from peft import LoraConfig

    from scope_marl.backends.hf import HFChatModel

    def sample(chat) -> list[float]:
        torch.manual_seed(1)
        chat.add_adapter("agent", LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
        out = chat.generate_ids([[5, 6, 7, 8]], SamplingParams(temperature=1.0, max_new_tokens=8, seed=3), adapters=["agent"])[0]
        return out.logprobs

    fresh = HFChatModel(make_tiny_model(), tokenizer, name="fresh")
    fresh.packed = PackedWeights(always=True)
    tiny_chat.packed = PackedWeights(always=True)
    sample(tiny_chat)
    packs = len(tiny_chat.packed)
    for key, adapter in (("a", "agent"), ("b", None)):
        tiny_chat.prefix_cache.store(key, CachedPrefix([5, 6], adapter, [], []))
    tiny_chat.prefix_cache.share("a")
    tiny_chat.prefix_cache.store("c", CachedPrefix([5, 6, 7], "agent", [], []))
    tiny_chat.remove_adapter("agent")
    assert tiny_chat.prefix_cache.reusable("c", [5, 6, 7, 8], "agent") == (None, 0), "states of the old adapter are gone"
    assert tiny_chat.prefix_cache.get("b") is not None, "the base model's states stay"
    gc.collect()
    assert len(tiny_chat.packed) < packs, "the deleted adapter's packed weights went with it"
    assert sample(tiny_chat) == sample(fresh)
    assert len(tiny_chat.packed) == packs, "the new adapter's LoRA linears run packed, as the first one's did"
