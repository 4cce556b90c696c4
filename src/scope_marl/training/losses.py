"""GRPO-family policy losses, each function next to the equation it implements.

Notation: one rollout group g holds the episodes of one task against one simulator; r_i is an
episode's reward for the role being trained; a stream's loss-masked tokens t are the tokens that
role sampled, with rollout log-prob old_t, current log-prob new_t and reference log-prob ref_t
(base model with adapters disabled).

The variants a learner config chooses between are registered by name (verl's ``core_algos``
pattern): advantage estimators under ``LearnerConfig.baseline`` (``@register_advantage``,
``get_advantage_fn``) and token-loss reductions under ``LearnerConfig.aggregation``
(``@register_loss_agg``, ``get_loss_agg_fn``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch

from scope_marl.config.train import Aggregation, Baseline
from scope_marl.core.registry import Registry

AdvantageFn = Callable[..., torch.Tensor]
"""``fn(rewards [B], group_ids, normalize_std=False, eps=1e-6) -> advantages [B]`` (float32)."""

ADVANTAGES: Registry[AdvantageFn] = Registry("baseline", "@register_advantage in scope_marl/training/losses.py")
"""Advantage estimators by the name ``LearnerConfig.baseline`` gives (config.train.Baseline lists the same names)."""


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: register an advantage estimator under the ``baseline`` name a learner config gives."""
    return ADVANTAGES.register(name)


def get_advantage_fn(name: str) -> AdvantageFn:
    """The advantage estimator registered as ``name``; an unknown name lists the known ones."""
    return ADVANTAGES.get(name)


def _group_statistics(rewards: torch.Tensor, group_ids: Sequence[str]):
    """Rewards as float, each sample's group index, and per group: the mean and population variance (ddof 0)."""
    rewards = rewards.float()
    ids = list(group_ids)
    if len(ids) != len(rewards):
        raise ValueError(f"{len(rewards)} rewards but {len(ids)} group ids")
    index = {g: k for k, g in enumerate(dict.fromkeys(ids))}
    group = torch.tensor([index[g] for g in ids])
    count = torch.zeros(len(index)).index_add_(0, group, torch.ones_like(rewards))
    mean = torch.zeros(len(index)).index_add_(0, group, rewards) / count
    centered = rewards - mean[group]
    var = torch.zeros(len(index)).index_add_(0, group, centered**2) / count
    return rewards, group, mean, var


@register_advantage("group")
def group_baseline(rewards: torch.Tensor, group_ids: Sequence[str], normalize_std: bool = False, eps: float = 1e-6) -> torch.Tensor:
    """A_i = r_i - mean_{j in g(i)} r_j, optionally divided by (std_g + eps) (GRPO).

    The release uses no std normalization (Dr. GRPO argues it biases toward easy / hard groups).
    A group whose rewards are all equal (std_g <= eps) gives A = 0 and teaches nothing, and is never
    divided by its ~0 std.
    """
    return _within_group(*_group_statistics(rewards, group_ids), normalize_std, eps)


def _within_group(rewards, group, mean, var, normalize_std: bool, eps: float) -> torch.Tensor:
    advantages = rewards - mean[group]
    if normalize_std:
        constant = var[group] <= eps**2
        advantages = torch.where(constant, advantages, advantages / (var[group].sqrt() + eps))
    return advantages


@register_advantage("batch")
def batch_baseline(rewards: torch.Tensor, group_ids: Sequence[str], normalize_std: bool = False, eps: float = 1e-6) -> torch.Tensor:
    """A_i = r_i - (1/G) sum_g mean_{j in g} r_j: every sample against the mean of the batch's group means
    (each task weighs the same); ``normalize_std`` does not apply.

    That is the baseline for a reward that is one number per group (tau2's variance curriculum),
    which a group baseline would cancel in every group.
    """
    rewards, _, mean, _ = _group_statistics(rewards, group_ids)
    return rewards - mean.mean()


@register_advantage("group_else_batch")
def group_else_batch_baseline(
    rewards: torch.Tensor, group_ids: Sequence[str], normalize_std: bool = False, eps: float = 1e-6
) -> torch.Tensor:
    """``group`` (optionally std-normalized), except that a group whose rewards are all equal is
    compared with the batch: A_i = r_i - (1/G) sum_g mean_{j in g} r_j there, instead of 0.

    A tie that merely happened teaches nothing under ``group``, which is right for a per-episode
    reward; a *group-level* reward is constant in every group, and this keeps its signal while groups
    with spread keep their own baseline. (Formerly ``constant_groups: batch``.)
    """
    rewards, group, mean, var = _group_statistics(rewards, group_ids)
    constant = var[group] <= eps**2
    return torch.where(constant, rewards - mean.mean(), _within_group(rewards, group, mean, var, normalize_std, eps))


def group_advantages(
    rewards: torch.Tensor,
    group_ids: Sequence[str],
    normalize_std: bool = False,
    eps: float = 1e-6,
    baseline: Baseline = "group",
) -> torch.Tensor:
    """Advantages under the registered ``baseline`` (``group``: GRPO's A_i = r_i - mean_{j in g(i)} r_j;
    ``batch``; ``group_else_batch``); see each estimator above."""
    return get_advantage_fn(baseline)(rewards, group_ids, normalize_std, eps)


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


def behaviour_weights(
    prox_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor, correction: str, cap: float
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """Per-token importance weights for tokens sampled by an older policy, and their statistics.

    With ``prox`` the learner's own log-probs before this batch's update (its proximal policy) and
    ``behav`` those the tokens were sampled with (an older version in asynchronous training, or another
    engine's float detail):

    - ``none``: no weight (None); the ratio's denominator is whatever ``old_logprobs`` chose;
    - ``tis``: w_t = min(exp(prox_t - behav_t), cap): truncated importance sampling (verl's TIS);
    - ``decoupled``: w_t = exp(prox_t - behav_t): AReaL's decoupled PPO, where the clip acts around the
      proximal policy and the behaviour ratio is a weight.

    With the ratio taken against ``prox`` (``learner.correction`` sets that), the token loss is
    w_t * -min(rho_t A, clip(rho_t) A). A batch sampled with the learner's own weights has w = 1. The
    statistics: the share of tokens the cap truncated, and the mean and max |prox - behav|.
    """
    m = mask.bool()
    n = max(int(m.sum()), 1)
    log_ratio = (prox_logp - behav_logp).detach()
    stats = {
        "behaviour_logratio_mean": float(log_ratio.abs()[m].sum()) / n,
        "behaviour_logratio_max": float(log_ratio.abs()[m].max()) if m.any() else 0.0,
    }
    if correction == "none":
        return None, {**stats, "truncated_fraction": 0.0}
    weights = torch.exp(log_ratio)
    truncated = weights > cap
    if correction == "tis":
        weights = weights.clamp(max=cap)
    elif correction != "decoupled":
        raise ValueError(f"unknown off-policy correction {correction!r}; choose none, tis or decoupled")
    return weights * mask, {**stats, "truncated_fraction": float(truncated[m].sum()) / n if correction == "tis" else 0.0}


def kl_k3(new_logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Low-variance, unbiased, non-negative estimator of KL(pi || ref) per sampled token (Schulman's k3).

    k3_t = exp(ref_t - new_t) - (ref_t - new_t) - 1
    """
    diff = ref_logp - new_logp
    return torch.exp(diff) - diff - 1.0


LossAggFn = Callable[[torch.Tensor, torch.Tensor, int | None], torch.Tensor]
"""``fn(token_loss [B, T], 0/1 mask [B, T], max_tokens) -> scalar``."""

LOSS_AGGREGATIONS: Registry[LossAggFn] = Registry("aggregation", "@register_loss_agg in scope_marl/training/losses.py")
"""Token-loss reductions by the name ``LearnerConfig.aggregation`` gives (config.train.Aggregation lists the same names)."""


_NORMALIZERS: dict[str, Literal["sequences", "tokens"]] = {}


def register_loss_agg(name: str, normalizer: Literal["sequences", "tokens"] = "sequences") -> Callable[[LossAggFn], LossAggFn]:
    """Decorator: register a reduction of per-token losses under the ``aggregation`` name a learner config gives.

    ``normalizer`` says what a micro-batch's loss is a mean over, so the learner weighs micro-batches
    to the full batch's loss: ``sequences`` (its share of the batch's streams) or ``tokens`` (its share
    of the batch's sampled tokens).
    """

    def decorate(fn: LossAggFn) -> LossAggFn:
        LOSS_AGGREGATIONS.add(name, fn)
        _NORMALIZERS[name] = normalizer
        return fn

    return decorate


def get_loss_agg_fn(name: str) -> LossAggFn:
    """The loss aggregation registered as ``name``; an unknown name lists the known ones."""
    return LOSS_AGGREGATIONS.get(name)


def loss_agg_normalizer(name: str) -> Literal["sequences", "tokens"]:
    """What the registered aggregation ``name`` averages a micro-batch over: ``sequences`` or ``tokens``."""
    get_loss_agg_fn(name)
    return _NORMALIZERS[name]


@register_loss_agg("seq_mean_token_mean")
def seq_mean_token_mean(token_loss: torch.Tensor, mask: torch.Tensor, max_tokens: int | None = None) -> torch.Tensor:
    """(1/B) sum_i (1/|o_i|) sum_t L_it (GRPO as published)."""
    mask = mask.to(token_loss.dtype)
    per_seq = (token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return per_seq.mean()


@register_loss_agg("token_mean", normalizer="tokens")
def token_mean(token_loss: torch.Tensor, mask: torch.Tensor, max_tokens: int | None = None) -> torch.Tensor:
    """sum_i sum_t L_it / sum_i |o_i| (DAPO: long answers weigh more)."""
    mask = mask.to(token_loss.dtype)
    return (token_loss * mask).sum() / mask.sum().clamp(min=1.0)


@register_loss_agg("dr_grpo")
def dr_grpo(token_loss: torch.Tensor, mask: torch.Tensor, max_tokens: int | None = None) -> torch.Tensor:
    """sum_i sum_t L_it / (B * max_tokens) (Dr. GRPO: a constant normalizer, no length bias)."""
    mask = mask.to(token_loss.dtype)
    if not max_tokens:
        raise ValueError("dr_grpo aggregation needs max_tokens (the constant normalizer)")
    return (token_loss * mask).sum() / (token_loss.shape[0] * max_tokens)


def aggregate(
    token_loss: torch.Tensor, mask: torch.Tensor, how: Aggregation = "seq_mean_token_mean", max_tokens: int | None = None
) -> torch.Tensor:
    """Reduce per-token losses [B, T] under a 0/1 mask to one scalar, by the registered aggregation ``how``.

    seq_mean_token_mean: (1/B) sum_i (1/|o_i|) sum_t L_it        (GRPO as published)
    token_mean:          sum_i sum_t L_it / sum_i |o_i|          (DAPO: long answers weigh more)
    dr_grpo:             sum_i sum_t L_it / (B * max_tokens)     (Dr. GRPO: a constant normalizer, no length bias)
    """
    return get_loss_agg_fn(how)(token_loss, mask, max_tokens)


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
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The full objective on a batch [B, T]: clipped surrogate + kl_coef * k3 - entropy_coef * H.

    ``advantages`` is per sequence [B] and broadcast over its tokens; ``weights`` [B, T] (off-policy
    correction, :func:`behaviour_weights`) multiply the surrogate's tokens. Returns the scalar loss and
    token-level statistics (clip fraction, mean k3 KL, mean entropy, mean ratio) over the mask.
    """
    adv = advantages[:, None].expand_as(new_logp)
    token_loss, was_clipped = clipped_surrogate(new_logp, old_logp, adv, eps_low, eps_high)
    if weights is not None:
        token_loss = token_loss * weights
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
