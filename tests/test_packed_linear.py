"""Pre-packed linear weights for sampling: same numbers as torch's path, never stale after an update."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.nn.functional as F

from scope_marl.backends.base import SamplingParams
from scope_marl.backends.packed_linear import PackedLinears, PackedWeights, packing_available
from tests.test_hf_backend import reference_scores

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN packed linear")


@pytest.mark.parametrize("shape", [(1, 96), (46, 96), (5, 1, 96)])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_torch_in_float32(shape, bias):
    torch.manual_seed(0)
    weight, x = torch.randn(200, 96), torch.randn(*shape)
    b = torch.randn(200) if bias else None
    packed = PackedWeights()
    with torch.inference_mode(), PackedLinears(packed):
        out = F.linear(x, weight, b)
    assert len(packed) == 1, "the weight was packed (the packed path ran)"
    assert out.shape == (*shape[:-1], 200)
    torch.testing.assert_close(out, F.linear(x, weight, b), atol=2e-4, rtol=1e-5)


def test_a_weight_changed_in_place_is_packed_again():
    torch.manual_seed(0)
    layer = torch.nn.Linear(96, 64)
    packed = PackedWeights()
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
    packed = PackedWeights()
    layer = torch.nn.Linear(32, 16)
    with torch.inference_mode(), PackedLinears(packed):
        layer(torch.randn(2, 32))
    assert len(packed) == 1
    del layer
    assert len(packed) == 0


def test_other_dtypes_take_torchs_own_path():
    weight, x = torch.randn(16, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)
    packed = PackedWeights()
    with PackedLinears(packed):
        out = F.linear(x, weight)
    assert len(packed) == 0 and torch.equal(out, F.linear(x, weight))


def test_sampling_after_a_weight_update_scores_under_the_new_weights(tiny_chat):
    """A learner sharing the model updates it in place between rollouts: the sampler's log-probs
    must be those of the new weights (the on-policy definition), not of a stale packed copy."""
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
