"""The models and the engine a training run plays and trains with, built from its config.

One base model holds every policy as a LoRA adapter: ``agent`` always, ``simulator`` in co-training.
The frozen KL reference is the base with adapters disabled. With ``finetune: full`` the agent is a
separate full copy of the model instead (sharded with FSDP2 where asked, or where a bfloat16 run needs
float32 master weights), and the untouched base is its reference. With a ``sampler`` server every seat
on the run's model plays there, while the learners train the local copy. What each Ray rollout worker
builds is the same engine (:func:`worker_engine`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from scope_marl.assembly import ModelCache, build_env, build_simulator
from scope_marl.backends import load_backend
from scope_marl.backends.hf import HFChatModel
from scope_marl.backends.placement import CPU, Placement, resolve_placement
from scope_marl.backends.seat import Seat
from scope_marl.config import TrainConfig
from scope_marl.envs import AGENT, USER
from scope_marl.rollout import RolloutEngine
from scope_marl.training import sharding

ADAPTERS = {AGENT: "agent", USER: "simulator"}


def add_run_adapters(chat: HFChatModel, cfg: TrainConfig) -> None:
    """The run's LoRA adapters on the base: the agent's (unless it is fully fine-tuned) and, in
    co-training, the simulator's."""
    from peft import LoraConfig

    lora = cfg.lora
    roles = ([] if cfg.finetune == "full" else [AGENT]) + ([USER] if cfg.simulator.mode == "trainable" else [])
    for role in roles:
        if ADAPTERS[role] in chat.adapters:
            continue
        init = getattr(cfg.simulator, "init", None) if role == USER else None
        if init is not None:  # co-training that starts from a saved simulator (e.g. scope sft's adapter)
            if not (Path(init) / "adapter_config.json").is_file():
                raise ValueError(f"simulator.init {init!r} is not a saved adapter directory (no adapter_config.json there)")
            chat.add_adapter(ADAPTERS[role], init)
            continue
        config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.target_modules))
        chat.add_adapter(ADAPTERS[role], config)


def build_policies(cfg: TrainConfig, models: ModelCache) -> tuple[HFChatModel, HFChatModel, RolloutEngine]:
    """The base model with the run's adapters, the model the agent plays on (the base, or its own full
    copy) and the rollout engine: what the trainer plays with, and what each Ray rollout worker builds.

    With ``cfg.sampler`` every seat on ``cfg.model`` plays on that server instead (the same weights,
    with the run's adapters pushed to it by the trainer), while the learners train the local copy."""
    chat = models.get(cfg.model)
    if not isinstance(chat, HFChatModel):
        raise ValueError(f"training needs a local transformers model (embedded or hf:PATH), got {cfg.model!r}")
    # LoRA: the agent is an adapter on the shared base. Full fine-tuning: the agent is its own
    # copy of the weights, and the shared base (which frozen simulators also play on) is its KL reference.
    full = cfg.finetune == "full"
    placement = models.placement or CPU
    if shards_agent(cfg, placement):
        # Sharded (training.sharding): float32 master weights, gathered in the compute dtype for each forward.
        agent_chat = load_backend(cfg.model, Placement(placement.device, torch.float32))
        sharding.open_world_of_one(placement.device)  # a single process still needs a process group
        sharding.shard(agent_chat.model, placement.dtype)
        agent_chat.packed = None  # the gathered weights are new tensors each time: no packed copies of them
    elif full:
        agent_chat = load_backend(cfg.model, placement)
    else:
        agent_chat = chat
    if full:
        chat.model.requires_grad_(False)
    add_run_adapters(chat, cfg)
    env = build_env(cfg.env, models)
    seats, agent_model = models, agent_chat
    if cfg.sampler is not None:
        seats = ModelCache()
        seats.register(cfg.model, remote_sampler(cfg.sampler, chat))
        agent_model = seats.get(cfg.model)
    simulator = build_simulator(cfg.simulator, seats)
    agent = Seat(
        model=agent_model, sampling=cfg.agent_sampling, adapter=None if full else ADAPTERS[AGENT], trainable=AGENT in cfg.trainable_roles
    )
    return chat, agent_chat, RolloutEngine(env, agent, simulator, cfg.rollout)


def shards_agent(cfg: TrainConfig, placement: Placement) -> bool:
    """Whether the fully fine-tuned agent is sharded with FSDP2: asked for (``hardware.parallel: fsdp``),
    or needed for float32 master weights under a bfloat16 run (then on however many ranks there are, one included)."""
    if cfg.hardware.parallel == "fsdp" and cfg.finetune != "full":
        raise ValueError(
            "hardware.parallel: fsdp shards a fully fine-tuned agent (finetune: full); LoRA runs keep a whole base on every "
            "rank in this release: use parallel: replicate with finetune: lora"
        )
    return cfg.finetune == "full" and (cfg.hardware.parallel == "fsdp" or placement.dtype != torch.float32)


def remote_sampler(spec: str, chat: HFChatModel):
    """The sampler server as a backend, checked to tokenize exactly as the learner's local copy does."""
    sampler = load_backend(spec)
    if not hasattr(sampler, "load_adapter"):
        raise ValueError(f"sampler {spec!r} cannot receive adapters; use a vllm:MODEL@URL server")
    probe = "Hello <|im_end|> 1.50 dollars"
    if sampler.encode_text(probe) != chat.encode_text(probe) or sampler.stop_ids != chat.stop_ids:
        raise ValueError(f"sampler {spec!r} tokenizes differently from the model the learners train; serve the same model")
    return sampler


def worker_engine(cfg: TrainConfig) -> RolloutEngine:
    """A Ray rollout worker's engine: the run's models and adapters (their weights arrive by push)."""
    return build_policies(cfg, ModelCache(resolve_placement(cfg.hardware)))[2]
