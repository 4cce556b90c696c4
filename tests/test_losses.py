"""GRPO-family losses against numbers computed by hand."""

from __future__ import annotations

import math
import typing

import pytest
import torch

from scope_marl.training.losses import (
    ADVANTAGES,
    LOSS_AGGREGATIONS,
    aggregate,
    clipped_surrogate,
    get_advantage_fn,
    get_loss_agg_fn,
    group_advantages,
    kl_k3,
    loss_agg_normalizer,
    policy_loss,
    zero_variance_share,
)


def test_group_advantages_subtract_the_group_mean():
    r = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0, 4.0])
    a = group_advantages(r, ["g1", "g1", "g2", "g2", "g3", "g3"])
    # g1 mean 0.5 -> +0.5, -0.5; g2 constant -> 0, 0; g3 mean 3 -> -1, +1
    assert a.tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0, -1.0, 1.0])


def test_group_advantages_with_std_normalization():
    r = torch.tensor([1.0, 0.0, 2.0, 4.0, 4.0, 4.0])
    a = group_advantages(r, ["a", "a", "b", "b", "c", "c"], normalize_std=True, eps=1e-6)
    # a: std 0.5 -> +-0.5 / 0.5 = +-1; b: std 1 -> -1, +1; c constant -> 0 (no division by ~0)
    assert a.tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0, 0.0, 0.0], abs=1e-5)


def test_constant_groups_get_a_batch_baseline_not_zero():
    # Group-level rewards (every member of a group shares it), as with tau2's curriculum reward.
    r = torch.tensor([0.9, 0.9, 0.1, 0.1, 0.5, 0.5])
    ids = ["a", "a", "b", "b", "c", "c"]
    assert group_advantages(r, ids).abs().sum() == 0, "plain GRPO cancels a group-level reward"
    a = group_advantages(r, ids, baseline="group_else_batch")
    # batch mean of group means = (0.9 + 0.1 + 0.5) / 3 = 0.5
    assert a.tolist() == pytest.approx([0.4, 0.4, -0.4, -0.4, 0.0, 0.0])
    # Groups with variance keep their own baseline.
    mixed = group_advantages(torch.tensor([1.0, 0.0, 0.3, 0.3]), ["x", "x", "y", "y"], baseline="group_else_batch")
    assert mixed.tolist() == pytest.approx([0.5, -0.5, 0.3 - 0.4, 0.3 - 0.4])
    assert zero_variance_share(r, ids) == 1.0 and zero_variance_share(torch.tensor([1.0, 0.0, 0.3, 0.3]), ["x", "x", "y", "y"]) == 0.5


def _advantages_before_the_registry(rewards, group_ids, normalize_std=False, constant_groups="zero", eps=1e-6, baseline="group"):
    """group_advantages as it was before `constant_groups` was folded into `baseline` (frozen copy)."""
    rewards = rewards.float()
    ids = list(group_ids)
    index = {g: k for k, g in enumerate(dict.fromkeys(ids))}
    group = torch.tensor([index[g] for g in ids])
    count = torch.zeros(len(index)).index_add_(0, group, torch.ones_like(rewards))
    mean = torch.zeros(len(index)).index_add_(0, group, rewards) / count
    centered = rewards - mean[group]
    var = torch.zeros(len(index)).index_add_(0, group, centered**2) / count
    if baseline == "batch":
        return rewards - mean.mean()
    constant = var[group] <= eps**2
    advantages = centered
    if normalize_std:
        advantages = torch.where(constant, advantages, advantages / (var[group].sqrt() + eps))
    if constant_groups == "batch":
        advantages = torch.where(constant, rewards - mean.mean(), advantages)
    return advantages


# Every old (baseline, constant_groups) setting and the new baseline that replaces it.
OLD_TO_NEW = {("group", "zero"): "group", ("group", "batch"): "group_else_batch", ("batch", "zero"): "batch", ("batch", "batch"): "batch"}


@pytest.mark.parametrize("normalize_std", [False, True])
@pytest.mark.parametrize(("old", "new"), list(OLD_TO_NEW.items()))
def test_every_old_setting_gives_the_same_advantages_bit_for_bit(old, new, normalize_std):
    generator = torch.Generator().manual_seed(0)
    for trial in range(20):
        groups = int(torch.randint(1, 7, (1,), generator=generator))
        size = int(torch.randint(1, 6, (1,), generator=generator))
        rewards = torch.rand(groups, size, generator=generator)
        if trial % 2:
            rewards = torch.round(rewards * 2) / 2  # ties: some groups constant by chance
        constant = torch.rand(groups, generator=generator) < 0.4
        rewards[constant] = rewards[constant][:, :1]  # group-level rewards in about 40% of the groups
        ids = [f"g{g}" for g in range(groups) for _ in range(size)]
        order = torch.randperm(groups * size, generator=generator)  # groups interleaved, as a batch may hold them
        flat, ids = rewards.flatten()[order], [ids[i] for i in order]
        baseline, constant_groups = old
        expected = _advantages_before_the_registry(flat, ids, normalize_std, constant_groups, baseline=baseline)
        for got in (
            get_advantage_fn(new)(flat, ids, normalize_std),
            group_advantages(flat, ids, normalize_std, baseline=new),
            get_advantage_fn(new)(flat.double(), ids, normalize_std=normalize_std, eps=1e-6),
        ):
            assert got.dtype == expected.dtype and torch.equal(got, expected), (old, new, trial)


def test_the_registries_hold_exactly_what_a_learner_config_can_name():
    from scope_marl.config.train import Aggregation, Baseline

    assert ADVANTAGES.names() == sorted(typing.get_args(Baseline)) == ["batch", "group", "group_else_batch"]
    assert LOSS_AGGREGATIONS.names() == sorted(typing.get_args(Aggregation))
    assert [loss_agg_normalizer(n) for n in ("seq_mean_token_mean", "token_mean", "dr_grpo")] == ["sequences", "tokens", "sequences"]
    with pytest.raises(
        ValueError, match="unknown baseline 'grpo'; known: batch, group, group_else_batch; add one with @register_advantage"
    ):
        get_advantage_fn("grpo")
    with pytest.raises(ValueError, match="unknown aggregation 'mean'; known: dr_grpo, seq_mean_token_mean, token_mean"):
        aggregate(torch.zeros(1, 1), torch.ones(1, 1), "mean")
    assert get_loss_agg_fn("token_mean")(torch.tensor([[1.0, 3.0]]), torch.tensor([[1, 1]]), None).item() == 2.0


def test_clipped_surrogate_asymmetric_epsilons():
    old = torch.zeros(4)
    new = torch.log(torch.tensor([1.5, 0.5, 1.1, 0.7]))
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    loss, clipped = clipped_surrogate(new, old, adv, eps_low=0.2, eps_high=0.28)
    # A>0, rho 1.5 -> clip to 1.28 -> -1.28 (clipped); A>0, rho 0.5 -> min(0.5, 0.8) = 0.5 -> -0.5 (not clipped)
    # A<0, rho 1.1 -> min(-1.1, -1.1) -> 1.1 (inside); A<0, rho 0.7 -> min(-0.7, -0.8) = -0.8 -> 0.8 (clipped)
    assert loss.tolist() == pytest.approx([-1.28, -0.5, 1.1, 0.8])
    assert clipped.tolist() == [True, False, False, True]


def test_kl_k3_matches_the_formula_and_is_zero_on_policy():
    new = torch.tensor([-1.0, -2.0, -0.5])
    ref = torch.tensor([-1.0, -1.0, -1.5])
    expected = [0.0, math.exp(1) - 1 - 1, math.exp(-1) + 1 - 1]
    assert kl_k3(new, ref).tolist() == pytest.approx(expected)
    assert (kl_k3(new, ref) >= 0).all()


def test_aggregations():
    loss = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    assert aggregate(loss, mask, "seq_mean_token_mean").item() == pytest.approx((2.0 + 4.0) / 2)
    assert aggregate(loss, mask, "token_mean").item() == pytest.approx(10.0 / 4)
    assert aggregate(loss, mask, "dr_grpo", max_tokens=8).item() == pytest.approx(10.0 / (2 * 8))
    with pytest.raises(ValueError, match="max_tokens"):
        aggregate(loss, mask, "dr_grpo")


def test_policy_loss_on_policy_has_unit_ratio_no_clipping_and_the_right_gradient():
    old = torch.log(torch.tensor([[0.5, 0.25, 1.0], [0.2, 0.1, 1.0]]))
    new = old.clone().requires_grad_(True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    adv = torch.tensor([1.0, -2.0])
    loss, stats = policy_loss(new, old, adv, mask, ref_logp=old, kl_coef=0.1)
    assert stats["ratio_mean"] == pytest.approx(1.0) and stats["clip_fraction"] == 0.0 and stats["kl"] == pytest.approx(0.0)
    # On policy, d(-rho*A)/d(new) = -A; seq-mean-token-mean divides by 2 tokens and 2 sequences; the KL term's gradient is 0.
    loss.backward()
    assert torch.allclose(new.grad, torch.tensor([[-0.25, -0.25, 0.0], [0.5, 0.5, 0.0]]))
    assert loss.item() == pytest.approx(-(1.0 - 2.0) / 2)


def test_entropy_bonus_lowers_the_loss():
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    ent = torch.tensor([[2.0, 4.0]])
    base, _ = policy_loss(old, old, torch.tensor([0.0]), mask, entropy=ent)
    bonus, stats = policy_loss(old, old, torch.tensor([0.0]), mask, entropy=ent, entropy_coef=0.01)
    assert bonus.item() == pytest.approx(base.item() - 0.01 * 3.0) and stats["entropy"] == pytest.approx(3.0)
