"""The learner's packed LM-head scoring: the closed-form gradient equals autograd's, chunking
changes nothing, and a model whose logits are more than head(body(x)) is refused."""

from __future__ import annotations

import pytest
import torch

import scope_marl.training.token_logprobs as tl


def reference(hidden, weight, bias, targets, temperature):
    logp_all = torch.log_softmax(torch.nn.functional.linear(hidden, weight, bias) / temperature, dim=-1)
    return logp_all.gather(1, targets[:, None]).squeeze(1), -(logp_all.exp() * logp_all).sum(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_bias", [False, True])
def test_frozen_head_scores_and_gradient_match_autograd(monkeypatch, temperature, with_bias):
    monkeypatch.setattr(tl, "CHUNK_ROWS", 4)  # 11 rows: three chunks, the last one short
    torch.manual_seed(0)
    weight = torch.randn(50, 8) * 2
    bias = torch.randn(50) if with_bias else None
    targets = torch.randint(0, 50, (11,))
    hidden = torch.randn(11, 8, requires_grad=True)
    expected_logp, expected_entropy = reference(hidden, weight, bias, targets, temperature)
    coefficients = torch.randn(11)
    (expected_grad,) = torch.autograd.grad((expected_logp * coefficients).sum(), hidden)

    logp, entropy = tl.token_logprobs(hidden, weight, bias, targets, temperature)
    assert torch.allclose(logp, expected_logp, atol=1e-5)
    assert torch.allclose(entropy, expected_entropy, atol=1e-5)
    assert not entropy.requires_grad  # no entropy bonus asked for: its gradient is not computed
    (grad,) = torch.autograd.grad((logp * coefficients).sum(), hidden)
    assert torch.allclose(grad, expected_grad, atol=1e-5)


def test_the_floored_tail_scores_exactly_even_a_target_deep_in_it(monkeypatch):
    """Logits spread so that most of the vocabulary's exps are subnormal: flooring the tail gives the
    same log-probs, entropies and gradient as no floor (to the bit), and autograd's log-probs and
    gradient, also for a target far below the floor."""
    torch.manual_seed(1)
    weight = torch.randn(400, 8) * 12
    hidden = torch.randn(6, 8, requires_grad=True)
    logits = torch.nn.functional.linear(hidden, weight)
    targets = logits.argmax(-1)
    targets[0] = logits[0].argmin()  # a token whose log-prob is far below -TAIL_FLOOR_NATS
    expected_logp, _ = reference(hidden, weight, None, targets, 0.7)
    assert expected_logp[0] < -2 * tl.TAIL_FLOOR_NATS and (torch.log_softmax(logits / 0.7, -1) < -87).float().mean() > 0.3
    (expected_grad,) = torch.autograd.grad(expected_logp.sum(), hidden)

    def scored():
        logp, entropy = tl.token_logprobs(hidden, weight, None, targets, 0.7)
        return logp, entropy, torch.autograd.grad(logp.sum(), hidden)[0]

    logp, entropy, grad = scored()
    assert torch.allclose(logp, expected_logp, atol=1e-4, rtol=1e-6) and torch.allclose(grad, expected_grad, atol=1e-5)
    monkeypatch.setattr(tl, "TAIL_FLOOR_NATS", float("inf"))
    for floored, unfloored in zip((logp, entropy, grad), scored()):
        assert torch.equal(floored, unfloored)


def test_entropy_bonus_and_trainable_head_take_autograd(monkeypatch):
    monkeypatch.setattr(tl, "CHUNK_ROWS", 4)
    torch.manual_seed(1)
    weight = torch.randn(30, 6, requires_grad=True)
    hidden = torch.randn(9, 6, requires_grad=True)
    targets = torch.randint(0, 30, (9,))
    logp, entropy = tl.token_logprobs(hidden, weight, None, targets, 1.0, entropy_grad=True)
    expected_logp, expected_entropy = reference(hidden, weight, None, targets, 1.0)
    loss, expected_loss = (logp - 0.1 * entropy).sum(), (expected_logp - 0.1 * expected_entropy).sum()
    grads = torch.autograd.grad(loss, [hidden, weight])
    expected = torch.autograd.grad(expected_loss, [hidden, weight])
    for g, e in zip(grads, expected):
        assert torch.allclose(g, e, atol=1e-5)


def test_without_grad_nothing_is_kept():
    weight, hidden, targets = torch.randn(20, 4), torch.randn(5, 4), torch.randint(0, 20, (5,))
    with torch.no_grad():
        logp, entropy = tl.token_logprobs(hidden.requires_grad_(), weight, None, targets, 1.0)
    expected_logp, expected_entropy = reference(hidden, weight, None, targets, 1.0)
    assert logp.grad_fn is None and entropy.grad_fn is None
    assert torch.allclose(logp, expected_logp, atol=1e-5) and torch.allclose(entropy, expected_entropy, atol=1e-5)


def test_a_model_that_edits_its_logits_is_refused(make_tiny_model):
    model = make_tiny_model()
    tl.check_head_decomposition(model)  # a plain causal LM passes

    class SoftCapped(type(model)):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = 30 * torch.tanh(out.logits / 30)
            return out

    model.__class__ = SoftCapped
    with pytest.raises(ValueError, match="not its LM head applied to its final hidden states"):
        tl.check_head_decomposition(model)


def test_a_bf16_model_is_scored_in_fp32_as_at_sampling():
    torch.manual_seed(2)
    weight = (torch.randn(40, 8) * 2).bfloat16()
    hidden = torch.randn(6, 8).bfloat16().requires_grad_()
    targets = torch.randint(0, 40, (6,))
    logits = torch.nn.functional.linear(hidden, weight).float()  # what sampling softmaxes
    expected = torch.log_softmax(logits, -1).gather(1, targets[:, None]).squeeze(1)
    logp, _ = tl.token_logprobs(hidden, weight, None, targets, 1.0)
    assert logp.dtype == torch.float32 and torch.allclose(logp, expected, atol=1e-5)
    (grad,) = torch.autograd.grad(logp.sum(), hidden)
    (expected_grad,) = torch.autograd.grad(expected.sum(), hidden)
    assert grad.dtype == torch.bfloat16 and torch.allclose(grad.float(), expected_grad.float(), atol=0.05, rtol=0.02)
