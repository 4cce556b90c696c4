"""GPU checks (``pytest -m gpu``): the learner and the rollout engine on a CUDA device, in bfloat16 and
float32. Each skips with its reason on a machine without a GPU; bench/gpu_check.sh runs them there."""

from __future__ import annotations

import copy

import pytest
import torch
from test_placement import sampled_episodes

from scope_marl.backends.hf import HFChatModel
from scope_marl.config import LearnerConfig, TrainConfig
from scope_marl.core.types import SamplingParams
from scope_marl.envs import AGENT
from scope_marl.training.learner import Learner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False here)"),
]


def test_bf16_lora_step_on_the_gpu(make_tiny_model, tokenizer):
    from peft import LoraConfig

    chat = HFChatModel(make_tiny_model(eot_bias=9.5).to("cuda", torch.bfloat16), tokenizer, default_system_prompt="You are a test model.")
    chat.add_adapter("agent", LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"]))
    lora = {n: p.detach().clone() for n, p in chat.model.named_parameters() if "lora_" in n}
    assert all(p.dtype == torch.float32 and p.device.type == "cuda" for p in lora.values())
    episodes = sampled_episodes(chat, "agent", 8)
    metrics = Learner(chat, AGENT, "agent", 1.0, LearnerConfig(lr=1e-2, kl_coef=0.01)).step(episodes)
    assert metrics["episodes"] == 8 and metrics["logprob_gap"] < 0.1
    moved = [n for n, p in chat.model.named_parameters() if "lora_" in n and not torch.equal(p, lora[n])]
    assert moved, "the update changed the adapter"


def test_full_fine_tuning_step_in_bf16_through_fully_shard_on_one_gpu(tiny_model_dir, tmp_path):
    """finetune: full in bfloat16 on one GPU runs through FSDP2 (a world of one): float32 master weights,
    bf16 compute; two steps train, the sampler/learner log-prob gap stays within bf16's error."""
    from test_trainer import config

    from scope_marl.experiment import start

    cfg = config(tiny_model_dir, finetune="full", eval={"every": 0}, steps=2, hardware={"device": "cuda", "dtype": "bfloat16"})
    trainer = start(TrainConfig.model_validate(cfg), tmp_path / "run")
    assert trainer.sharded and trainer.placement.on_gpu
    records = trainer.run(progress=False)
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["train_agent"].get("logprob_gap", 0.0) < 0.1 for r in records)
    masters = list(trainer.agent_chat.model.parameters())
    assert all(p.dtype == torch.float32 for p in masters), "master weights stay float32"


def test_greedy_decoding_on_the_gpu_matches_the_cpu(make_tiny_model, tokenizer):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = make_tiny_model(eot_bias=9.5)
    cpu = HFChatModel(copy.deepcopy(model), tokenizer, default_system_prompt="You are a test model.")
    gpu = HFChatModel(model.to("cuda"), tokenizer, default_system_prompt="You are a test model.")
    prompts = [cpu.encode_text(text) for text in ("Hello there", "Would you donate?", "Tell me about the weather today")]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    on_cpu = [g.token_ids for g in cpu.generate_ids(prompts, greedy)]
    on_gpu = [g.token_ids for g in gpu.generate_ids(prompts, greedy)]
    assert on_gpu == on_cpu


def test_fsdp2_on_one_rank_gives_the_unsharded_gradient(make_tiny_model, tokenizer):
    from scope_marl.training import sharding

    model = make_tiny_model().to("cuda")
    streams = [e.streams[AGENT] for e in sampled_episodes(HFChatModel(copy.deepcopy(model), tokenizer), None, 4)]
    grads = []
    for shard in (False, True):
        chat = HFChatModel(copy.deepcopy(model), tokenizer)
        if shard:
            sharding.open_world_of_one(torch.device("cuda"))
            sharding.shard(chat.model, torch.float32)
        learner = Learner(chat, AGENT, None, 1.0, LearnerConfig(kl_coef=0.0))
        logp, entropy, mask = learner.score(streams)
        ((logp * mask).sum() + 0.05 * (entropy * mask).sum()).backward()
        grads.append([sharding.full(p.grad).float().cpu() for p in chat.model.parameters()])
    assert all(torch.allclose(a, b, atol=1e-4, rtol=1e-3) for a, b in zip(*grads))
