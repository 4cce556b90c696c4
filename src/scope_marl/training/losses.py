"""GRPO-family policy losses, each function next to the equation it implements.

Notation: one rollout group g holds the episodes of one task against one simulator; r_i is an
episode's reward for the role being trained; a stream's loss-masked tokens t are the tokens that
role sampled, with rollout log-prob old_t, current log-prob new_t and reference log-prob ref_t
(base model with adapters disabled).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from scope_marl.config.train import Aggregation


def group_advantages(
    rewards: torch.Tensor,
    group_ids: Sequence[str],
    normalize_std: bool = False,
    constant_groups: Literal["zero", "batch"] = "zero",
    eps: float = 1e-6,
    baseline: Literal["group", "batch"] = "group",
) -> torch.Tensor:
    """A_i = r_i - mean_{j in g(i)} r_j, optionally divided by (std_g + eps).

    ``baseline="batch"`` compares every sample with the batch instead of its group:
    A_i = r_i - mean over the batch's groups of the group means (each task weighs the same). That is
    the baseline for a reward that is one number per group (tau2's variance curriculum), which a
    group baseline would cancel in every group.

    The release uses no std normalization (Dr. GRPO argues it biases toward easy / hard groups).
    A group whose rewards are all equal gives A = 0 and teaches nothing. That is right for a reward
    that merely happened to tie, but a *group-level* reward (tau2's curriculum reward is a function
    of the group's own variance) is constant in every group, so GRPO would cancel it entirely. With
    ``constant_groups="batch"`` such groups are compared with the batch instead:
    A_i = r_i - mean over all groups of the group means.
    """
    rewards = rewards.float()
    ids = list(group_ids)
    if len(ids) != len(rewards):
        raise ValueError(f"{len(rewards)} rewards but {len(ids)} group ids")
    index = {g: k for k, g in enumerate(dict.fromkeys(ids))}
    group = torch.tensor([index[g] for g in ids])
    count = torch.zeros(len(index)).index_add_(0, group, torch.ones_like(rewards))
    mean = torch.zeros(len(index)).index_add_(0, group, rewards) / count
    centered = rewards - mean[group]
    var = torch.zeros(len(index)).index_add_(0, group, centered**2) / count  # population variance (ddof 0)
    if baseline == "batch":
        return rewards - mean.mean()
    constant = var[group] <= eps**2
    advantages = centered
    if normalize_std:
        advantages = torch.where(constant, advantages, advantages / (var[group].sqrt() + eps))
    if constant_groups == "batch":
        advantages = torch.where(constant, rewards - mean.mean(), advantages)
    return advantages


def zero_variance_share(rewards: torch.Tensor, group_ids: Sequence[str], eps: float = 1e-6) -> float:
    """Share of groups whose rewards are all equal (they carry no GRPO signal without a batch baseline)."""
    groups: dict[str, list[float]] = {}
    for g, r in zip(group_ids, rewards.tolist()):
        groups.setdefault(g, []).append(r)
    return sum(max(v) - min(v) <= eps for v in groups.values()) / max(len(groups), 1)


def clipped_surrogate(
    new_logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, eps_low: float = 0.2, eps_high: float = 0.28
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO loss with asymmetric clipping (DAPO's clip-higher), and where clipping was active.

    rho_t = exp(new_t - old_t)
    L_t = -min(rho_t * A, clip(rho_t, 1 - eps_low, 1 + eps_high) * A)
    A token is "clipped" when the clipped branch is the one taken and differs from the unclipped one.
    """
    ratio = torch.exp(new_logp - old_logp)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    was_clipped = clipped < unclipped
    return loss, was_clipped


def kl_k3(new_logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Low-variance, unbiased, non-negative estimator of KL(pi || ref) per sampled token (Schulman's k3).

    k3_t = exp(ref_t - new_t) - (ref_t - new_t) - 1
    """
    diff = ref_logp - new_logp
    return torch.exp(diff) - diff - 1.0


def aggregate(
    token_loss: torch.Tensor, mask: torch.Tensor, how: Aggregation = "seq_mean_token_mean", max_tokens: int | None = None
) -> torch.Tensor:
    """Reduce per-token losses [B, T] under a 0/1 mask to one scalar.

    seq_mean_token_mean: (1/B) sum_i (1/|o_i|) sum_t L_it        (GRPO as published)
    token_mean:          sum_i sum_t L_it / sum_i |o_i|          (DAPO: long answers weigh more)
    dr_grpo:             sum_i sum_t L_it / (B * max_tokens)     (Dr. GRPO: a constant normalizer, no length bias)
    """
    mask = mask.to(token_loss.dtype)
    total = (token_loss * mask).sum()
    if how == "token_mean":
        return total / mask.sum().clamp(min=1.0)
    if how == "seq_mean_token_mean":
        per_seq = (token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        return per_seq.mean()
    if how == "dr_grpo":
        if not max_tokens:
            raise ValueError("dr_grpo aggregation needs max_tokens (the constant normalizer)")
        return total / (token_loss.shape[0] * max_tokens)
    raise ValueError(f"unknown aggregation {how!r}; use seq_mean_token_mean, token_mean or dr_grpo")


def policy_loss(
    new_logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    how: Aggregation = "seq_mean_token_mean",
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The full objective on a batch [B, T]: clipped surrogate + kl_coef * k3 - entropy_coef * H.

    ``advantages`` is per sequence [B] and broadcast over its tokens. Returns the scalar loss and
    token-level statistics (clip fraction, mean k3 KL, mean entropy, mean ratio) over the mask.
    """
    adv = advantages[:, None].expand_as(new_logp)
    token_loss, was_clipped = clipped_surrogate(new_logp, old_logp, adv, eps_low, eps_high)
    kl = kl_k3(new_logp, ref_logp) if ref_logp is not None else torch.zeros_like(new_logp)
    if kl_coef:
        token_loss = token_loss + kl_coef * kl
    if entropy_coef and entropy is not None:
        token_loss = token_loss - entropy_coef * entropy
    loss = aggregate(token_loss, mask, how, max_tokens)
    m = mask.bool()
    n = max(int(m.sum()), 1)
    with torch.no_grad():
        stats = {
            "clip_fraction": float(was_clipped[m].sum()) / n,
            "kl": float(kl[m].sum()) / n,
            "ratio_mean": float(torch.exp(new_logp - old_logp)[m].sum()) / n,
            "entropy": float(entropy[m].sum()) / n if entropy is not None else float("nan"),
        }
    return loss, stats
