"""Device and precision as configuration (``hardware:``): resolution, placement of loaded models, the
bfloat16 path's float32 master weights and log-probs, every learner and sampler tensor on the model's
device, and activation checkpointing."""

from __future__ import annotations

import copy

import pytest
import torch

from scope_marl.backends.base import BackendError
from scope_marl.backends.hf import HFChatModel
from scope_marl.backends.placement import CPU, Placement, resolve_placement
from scope_marl.backends.sampling import sample_next
from scope_marl.config import ConfigError, HardwareSettings, LearnerConfig, TrainConfig, validate
from scope_marl.core.types import Episode, EpisodeStatus, RoleStream, SamplingParams
from scope_marl.envs import AGENT
from scope_marl.training.learner import Learner

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the messages of a machine without a GPU")


def stream(prompt, response) -> RoleStream:
    n = len(response)
    return RoleStream(role=AGENT, prompt_ids=prompt, response_ids=response, loss_mask=[1] * n, logprobs=[0.0] * n, entropies=[0.0] * n)


def sampled_episodes(chat: HFChatModel, adapter: str | None, n: int, max_new_tokens: int = 16) -> list[Episode]:
    """``n`` replies sampled from one prompt (seeded), as completed agent episodes in groups of 4, rewards 0 / 1 alternating."""
    prompt = chat.encode_text("Would you give a dollar to a children's charity?")
    sampling = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens)
    generations = chat.generate_ids([prompt] * n, sampling, adapters=[adapter] * n, seeds=list(range(n)))
    episodes = []
    for i, g in enumerate(generations):
        streams = {
            AGENT: RoleStream(
                role=AGENT,
                prompt_ids=prompt,
                response_ids=g.token_ids,
                loss_mask=[1] * len(g.token_ids),
                logprobs=g.logprobs,
                entropies=g.entropies,
                reward=float(i % 2),
            )
        }
        episodes.append(
            Episode(
                episode_id=f"e/{i}", task_id="t", group_id=f"g{i // 4}", simulator_id="s", status=EpisodeStatus.COMPLETED, streams=streams
            )
        )
    return episodes


def lora_chat(model, tokenizer, name: str = "agent") -> HFChatModel:
    from peft import LoraConfig

    chat = HFChatModel(model, tokenizer, default_system_prompt="You are a test model.")
    torch.manual_seed(1)
    chat.add_adapter(name, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False))
    return chat


@no_gpu
def test_auto_is_the_cpu_in_float32_here_and_cuda_without_a_gpu_is_an_error_with_the_fix():
    assert resolve_placement(HardwareSettings()) == CPU
    assert resolve_placement(HardwareSettings(dtype="bfloat16")) == Placement(torch.device("cpu"), torch.bfloat16)
    assert CPU.describe() == "hardware: cpu, float32"
    with pytest.raises(BackendError, match=r"sees no CUDA GPU.*use device: cpu \(or auto\)"):
        resolve_placement(HardwareSettings(device="cuda:1"))


def test_a_bad_device_is_a_config_error_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match="hardware.device"):
        validate({"hardware": {"device": "gpu"}}, TrainConfig, tmp_path / "c.yaml")


def test_a_model_directory_loads_in_the_placements_dtype(tiny_model_dir):
    chat = HFChatModel.from_pretrained(tiny_model_dir, placement=Placement(torch.device("cpu"), torch.bfloat16))
    assert chat.dtype == torch.bfloat16 and chat.device == torch.device("cpu")
    assert HFChatModel.from_pretrained(tiny_model_dir).dtype == torch.float32  # no placement: today's fp32 CPU model


def test_bfloat16_base_keeps_float32_adapters_optimizer_state_and_log_probs(make_tiny_model, tokenizer):
    """A bf16 base: the LoRA adapter (master weights) and AdamW's state are float32, decoding keeps its KV
    cache in bf16, log-probs are float32, and the learner re-scores the sampled tokens within bf16's error."""
    chat = lora_chat(make_tiny_model(eot_bias=9.5).to(torch.bfloat16), tokenizer)
    lora = [p for n, p in chat.model.named_parameters() if "lora_" in n]
    assert lora and all(p.dtype == torch.float32 for p in lora)
    assert chat.dtype == torch.bfloat16
    session = chat.open_session(SamplingParams(temperature=1.0, max_new_tokens=8))
    assert session.cache.dtype == torch.bfloat16
    episodes = sampled_episodes(chat, "agent", 4, max_new_tokens=8)
    learner = Learner(chat, AGENT, "agent", 1.0, LearnerConfig(lr=1e-3, kl_coef=0.01))
    with torch.no_grad():
        logp, entropy, mask = learner.score([e.streams[AGENT] for e in episodes])
    assert logp.dtype == entropy.dtype == mask.dtype == torch.float32
    metrics = learner.step(episodes)
    assert metrics["logprob_gap"] < 0.1, "bf16 re-scoring of the sampled tokens stays within bf16's error"
    states = [t for state in learner.optimizer.state.values() for t in state.values() if torch.is_tensor(t) and t.dim() > 0]
    assert states and all(t.dtype == torch.float32 for t in states)


def test_learner_and_sampler_tensors_follow_the_models_device(make_tiny_model, tokenizer):
    """On the ``meta`` device (no data: a tensor made on the CPU by mistake meets a meta tensor and the op
    fails) the learner scores through both paths and the sampler draws, every result on the model's device."""
    import torch.fx.experimental._config as fx_config
    import transformers.masking_utils as masking

    chat = lora_chat(make_tiny_model(), tokenizer)
    learner = Learner(chat, AGENT, "agent", 1.0, LearnerConfig(kl_coef=0.0))
    chat.model.to("meta")
    streams = [stream([1, 2, 3], [4, 5]), stream([1, 2], [6])]
    patch = pytest.MonkeyPatch()
    patch.setattr(fx_config, "meta_nonzero_assume_all_nonzero", True)  # boolean indexing on meta: assume every entry kept
    patch.setattr(masking, "_ignore_causal_mask_sdpa", lambda *a, **k: False)  # transformers reads the mask's values there
    try:
        for checkpointing in (False, True):
            learner.config.gradient_checkpointing = checkpointing
            logp, entropy, mask = learner.score(streams)
            assert {logp.device.type, entropy.device.type, mask.device.type} == {"meta"}
        for sampling, generator in (
            (SamplingParams(temperature=1.0, top_p=0.9), None),
            (SamplingParams(temperature=0.7), [torch.Generator()] * 3),
        ):
            ids, logprobs, entropies = sample_next(torch.zeros(3, 100, device="meta"), sampling, generator)
            assert {ids.device.type, logprobs.device.type, entropies.device.type} == {"meta"}
    finally:
        patch.undo()
    from scope_marl.backends.kv_cache import RowCache

    cache = RowCache(2, 2, 16, torch.bfloat16, "meta")
    assert cache.no_mask.device.type == cache.lengths.device.type == "meta"


def test_gradient_checkpointing_gives_the_same_log_probs_and_gradients(make_tiny_model, tokenizer):
    """Checkpointed scoring runs each stream whole and replays every layer in the backward; the numbers
    are those of the shared-prompt path up to float error."""
    chat = lora_chat(make_tiny_model(), tokenizer)
    twin = copy.deepcopy(chat)
    streams = [stream([1, 2, 3, 4], [5, 6, 7]), stream([1, 2, 3, 4], [8]), stream([9, 10], [11, 12])]
    results = []
    for model, checkpointing in ((chat, False), (twin, True)):
        learner = Learner(model, AGENT, "agent", 0.8, LearnerConfig(kl_coef=0.0, gradient_checkpointing=checkpointing))
        logp, entropy, mask = learner.score(streams)
        ((logp * mask).sum() + 0.1 * (entropy * mask).sum()).backward()
        results.append((logp.detach(), [p.grad.clone() for p in learner.params]))
    (logp_a, grads_a), (logp_b, grads_b) = results
    assert torch.allclose(logp_a, logp_b, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(grads_a, grads_b))
    assert any(g.abs().sum() > 0 for g in grads_a)


@no_gpu
def test_scope_generate_takes_device_and_dtype_and_refuses_what_this_machine_lacks():
    from typer.testing import CliRunner

    from scope_marl.cli import app

    runner = CliRunner()
    ok = runner.invoke(app, ["generate", "-p", "hi", "--model", "scripted:hello", "--device", "cpu", "--dtype", "bfloat16"])
    assert ok.exit_code == 0 and "hello" in ok.output
    no_gpu_here = runner.invoke(app, ["generate", "-p", "hi", "--model", "scripted:hello", "--device", "cuda"])
    assert no_gpu_here.exit_code != 0 and "sees no CUDA GPU" in no_gpu_here.output and "Traceback" not in no_gpu_here.output
    typo = runner.invoke(app, ["generate", "-p", "hi", "--model", "scripted:hello", "--device", "gpu"])
    assert typo.exit_code != 0 and "device" in typo.output and "Traceback" not in typo.output
