"""FSDP2 sharding of a fully fine-tuned policy, and activation checkpointing for the learner.

``hardware.parallel: fsdp`` (and full fine-tuning in bfloat16 on one GPU, where it keeps float32
master weights) shards the agent's own copy of the model with ``torch.distributed.fsdp.fully_shard``:
each decoder layer is one unit, then the whole model. Every rank then holds 1/N of the float32
weights, gradients and AdamW state; a forward gathers one layer's weights at a time in the compute
dtype (``MixedPrecisionPolicy``: bfloat16 parameters, float32 gradient reduction) and frees them
after. Gradients are *summed* over ranks (divide factor 1), as the learner's data-parallel
normalizers expect (each rank's loss is its share of the whole batch).

Rollouts cannot gather layer by layer: ranks play different episodes, so their decode steps (and the
collectives each forward would join) differ in number. :func:`gathered` therefore gathers the whole
model once on every rank for the rollout (and an evaluation), keeps it gathered across forwards,
and reshards it before the update: generation needs the full compute-dtype weights per rank, while
the master weights, gradients and optimizer state (8 of the 10 bytes a parameter costs in training
with bfloat16 weights) stay sharded.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

import torch


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full(value):
    """A plain tensor from a DTensor (a sharded model's gradient norm), anything else as it is."""
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def open_world_of_one(device: torch.device) -> None:
    """A process group of one rank (FSDP2 needs one even when nothing is split: a single GPU running
    full fine-tuning in bfloat16 with float32 master weights)."""
    if torch.distributed.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    store = torch.distributed.HashStore()
    torch.distributed.init_process_group(backend, store=store, rank=0, world_size=1)
    os.environ.setdefault("LOCAL_RANK", "0")


def shard(model: torch.nn.Module, compute_dtype: torch.dtype) -> None:
    """``fully_shard`` every decoder layer, then the model (in place). The model's own weights must be
    float32 (the master copy); ``compute_dtype`` is what forwards and backwards run in."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from scope_marl.training.token_logprobs import body_and_head

    body, _ = body_and_head(model)
    policy = MixedPrecisionPolicy(
        param_dtype=None if compute_dtype == torch.float32 else compute_dtype,
        reduce_dtype=torch.float32,
    )
    for layer in body.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    for unit in _units(model):  # each unit reduces its own gradients
        unit.set_gradient_divide_factor(1.0)  # summed, not averaged: the learner normalizes by batch-wide totals
        unit.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no pre-multiplied sum; NCCL copies less)


def run_body(model: torch.nn.Module, body: torch.nn.Module, **inputs) -> torch.Tensor:
    """``body(**inputs)``'s last hidden states. A sharded model is entered through its root instead: FSDP2
    keeps the embeddings, final norm and LM head in the root unit, which only the root's forward gathers
    (and keeps gathered for the head pass and the backward); the head runs there on no position at all."""
    if not is_sharded(model):
        return body(**inputs).last_hidden_state
    captured = []
    handle = body.register_forward_hook(lambda module, args, out: captured.append(out.last_hidden_state))
    try:
        model(**inputs, logits_to_keep=torch.empty(0, dtype=torch.long, device=inputs["input_ids"].device))
    finally:
        handle.remove()
    return captured[0]


def _units(model: torch.nn.Module) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered(model: torch.nn.Module) -> Iterator[None]:
    """The whole sharded ``model`` gathered on every rank for the block (one collective per unit on
    entry, none per forward inside, every rank must enter); resharded on exit. Not sharded: nothing."""
    if not is_sharded(model):
        yield
        return
    units = _units(model)
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
    for unit in units:
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            # As fully_shard leaves them: layers free their weights after each forward; the root keeps its
            # own (embeddings, final norm, head) for the head pass and the backward that follow.
            unit.set_reshard_after_forward(unit is not model, recurse=False)


def _checkpointed(forward, *args, **kwargs):
    from torch.utils.checkpoint import checkpoint

    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


@contextlib.contextmanager
def checkpointed_layers(body: torch.nn.Module) -> Iterator[None]:
    """Every decoder layer of ``body`` keeps only its inputs in the forward and recomputes its
    activations in the backward (torch's non-reentrant checkpoint, wrapped around each layer's own
    forward so module hooks, FSDP's included, run once). The layers must not write a cache."""
    layers = list(body.layers)
    for layer in layers:
        layer.forward = functools.partial(_checkpointed, layer.forward)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward  # the class's forward again
