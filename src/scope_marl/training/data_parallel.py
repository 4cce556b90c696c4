"""Data-parallel training under ``torch.distributed``: N ranks, each with its own copy of the models.

Launched by torchrun (``torchrun --nproc-per-node N -m scope_marl.cli train CONFIG --out RUN``), which
sets ``WORLD_SIZE`` / ``RANK`` / ``MASTER_ADDR``; :func:`join_from_environment` then opens the process
group (gloo on CPU, NCCL on GPU). Every step:

- each rank plays a contiguous block of the step's groups under the numbers one process would give
  them (per-episode seeds), and the blocks are gathered, so every rank holds the whole batch;
- each learner takes whole groups of it (:func:`shard_groups`), normalizes by batch-wide totals
  (:func:`all_ranks`) and sums gradients across ranks, so every rank applies the full-batch update
  and the copies stay equal;
- rank 0 alone writes: rollouts, metrics, evaluation, pool snapshots and checkpoints; the others
  wait at a barrier where they must read what it wrote. Any rank resumes from rank 0's checkpoints.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TypeVar

import torch

from scope_marl.core.types import Episode

T = TypeVar("T")


def distributed() -> bool:
    """Whether this process is one rank of a data-parallel group of more than one."""
    return torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1


def rank() -> int:
    return torch.distributed.get_rank() if distributed() else 0


def world() -> int:
    return torch.distributed.get_world_size() if distributed() else 1


def join_from_environment() -> bool:
    """Open the process group torchrun describes in the environment (``WORLD_SIZE`` > 1); False when
    this is a plain single process."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or distributed():
        return distributed()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.distributed.init_process_group(backend)
    return True


def _device() -> torch.device:
    return torch.device("cuda") if torch.distributed.get_backend() == "nccl" else torch.device("cpu")


def all_ranks(value: float, op: str = "sum") -> float:
    """``value`` summed (or maxed) over the ranks; itself when there is one."""
    if not distributed():
        return value
    t = torch.tensor([float(value)], dtype=torch.float64, device=_device())
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX if op == "max" else torch.distributed.ReduceOp.SUM)
    return int(t.item()) if isinstance(value, int) else float(t.item())


def all_reduce_(tensor: torch.Tensor) -> None:
    """Sum ``tensor`` over the ranks, in place (a gradient)."""
    if distributed():
        torch.distributed.all_reduce(tensor)


def gather(items: list[T]) -> list[T]:
    """Every rank's ``items``, concatenated in rank order, on every rank."""
    if not distributed():
        return list(items)
    parts: list = [None] * world()
    torch.distributed.all_gather_object(parts, list(items))
    return [x for part in parts for x in part]


def broadcast(value: T) -> T:
    """Rank 0's ``value`` on every rank (what the others pass is ignored); itself when there is one rank."""
    if not distributed():
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if distributed():
        torch.distributed.barrier()


def shard_groups(episodes: Sequence[Episode], rank: int, world: int) -> list[Episode]:
    """This rank's share of a batch: whole GRPO groups, group k (in order of appearance) to rank k % world."""
    order = list(dict.fromkeys(e.group_id for e in episodes))
    mine = {g for k, g in enumerate(order) if k % world == rank}
    return [e for e in episodes if e.group_id in mine]
