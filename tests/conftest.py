"""Shared fixtures: the SmolLM2 tokenizer with tiny random-weight models (seconds, not minutes)."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import LlamaForCausalLM


def _compiled(load, what: str):
    """A compiled op (backends.kernels); skips where no C++ compiler builds it, fails under CI (which installs g++)."""
    found = load()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must build the {what} op (a C++ compiler is installed there)")
        pytest.skip(f"no working C++ compiler here: the {what} op cannot be built")
    return found


@pytest.fixture(scope="session")
def rows_attention_op():
    from scope_marl.backends import rows_attention

    return _compiled(rows_attention.load, "decode-attention")


@pytest.fixture(scope="session")
def sample_rows_op():
    from scope_marl.backends import sampling

    return _compiled(sampling.compiled_sampler, "sampling")


@pytest.fixture(params=["torch", "compiled"])
def compiled_sampling(request) -> bool:
    """Each sampling test runs on torch's ops and on the compiled op."""
    if request.param == "compiled":
        request.getfixturevalue("sample_rows_op")
    return request.param == "compiled"


@pytest.fixture
def state_copies(monkeypatch) -> list[str]:
    """Names of the RowCache calls that copy key/value states (into, out of or between slots), in order."""
    from scope_marl.backends.kv_cache import RowCache

    calls: list[str] = []
    for name in ("put", "states", "copy", "move"):
        original = getattr(RowCache, name)
        monkeypatch.setattr(RowCache, name, lambda self, *a, _f=original, _n=name: calls.append(_n) or _f(self, *a))
    return calls


@pytest.fixture(scope="session")
def tokenizer():
    from scope_marl.backends.embedded import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def make_tiny_model(tokenizer):
    """Factory for a 2-layer, hidden-64 Llama with the SmolLM2 vocabulary and a fixed seed."""
    from transformers import LlamaConfig

    def make(seed: int = 0, eot_bias: float = 0.0):
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            tie_word_embeddings=True,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
        # Random init gives near-uniform next-token distributions; sharpen them so sampling,
        # top-p and end-of-turn behave more like a trained model's.
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(8.0)
        if eot_bias:  # a constant on the end-of-turn logit (a bias on the tied head), so random weights end turns now and then
            head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=True, device="meta")
            head.weight = model.model.embed_tokens.weight
            bias = torch.zeros(config.vocab_size)
            bias[tokenizer.eos_token_id] = eot_bias
            head.bias = torch.nn.Parameter(bias, requires_grad=False)
            model.lm_head = head
        return model

    return make


@pytest.fixture
def tiny_chat(make_tiny_model, tokenizer):
    from scope_marl.backends.hf import HFChatModel

    return HFChatModel(make_tiny_model(), tokenizer, name="tiny", default_system_prompt="You are a test model.")


@pytest.fixture
def talky_chat(make_tiny_model, tokenizer):
    """A tiny model that ends a turn after ~12 tokens on average (end-of-turn logit boosted)."""
    from scope_marl.backends.hf import HFChatModel

    return HFChatModel(make_tiny_model(eot_bias=EOT_BIAS), tokenizer, name="talky", default_system_prompt="You are a test model.")


EOT_BIAS = 9.5


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, make_tiny_model, tokenizer):
    """A tiny Llama saved like any transformers model, so configs can name it as hf:PATH."""
    path = tmp_path_factory.mktemp("tiny-model")
    model = make_tiny_model()
    plain = LlamaForCausalLM(model.config)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def talky_model_dir(tmp_path_factory, make_tiny_model, tokenizer):
    """The tiny Llama saved with an end-of-turn embedding (tied: also its output row) along the mean
    direction of the model's final hidden states, so its turns end after a few tokens or run to the
    limit, depending on what was sampled: episodes of very different lengths from a plain checkpoint."""
    path = tmp_path_factory.mktemp("talky-model")
    model = make_tiny_model()
    with torch.no_grad():
        ids = torch.randint(0, len(tokenizer), (64, 40), generator=torch.Generator().manual_seed(0))
        mean = model.model(ids).last_hidden_state.reshape(-1, model.config.hidden_size).mean(0)
        model.model.embed_tokens.weight[tokenizer.eos_token_id] = 8.0 * mean / mean.norm()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def pytest_collection_modifyitems(config, items):
    """Tests marked ``vllm`` run only when asked for (``pytest -m vllm``): they need vLLM's own venv."""
    if "vllm" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="opt-in: pytest -m vllm (needs vLLM's venv: scope serve vllm --install-only)")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)
