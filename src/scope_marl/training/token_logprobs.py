"""Log-probs (and entropies) of chosen tokens from final hidden states through the LM head.

The learner needs, for N response tokens, log p(y | context) under the temperature-scaled full
distribution: logits z = h W^T / T over the whole vocabulary, then z_y - logsumexp(z). Done naively
on a [N, V] logits tensor (V = 49,152 for SmolLM2) with autograd, the backward keeps that tensor
alive and runs log-softmax's backward and a [N, V] x [V, H] product over it. Here the logits are
built a chunk of rows at a time and dropped, and when the head is frozen (LoRA) the gradient with
respect to h is known in closed form,

    d logp_y / d h = (W_y - sum_v p_v W_v) / T = (W_y - p W) / T,

so the forward stores that [N, H] factor instead of any [N, V] tensor and the backward is one
multiply. The factor's p W is the same product autograd's backward would compute: the FLOPs are
unchanged, the memory traffic and the elementwise passes over [N, V] are not.

A trainable head (full fine-tuning) or an entropy bonus (its gradient is not this closed form) takes
the plain autograd path, still chunked. A head bias shifts the logits and leaves the factor as is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from scope_marl.backends.sampling import TAIL_FLOOR_NATS

CHUNK_ROWS = 128  # rows of [rows, V] logits alive at a time: 25 MB at V = 49,152 in fp32


def body_and_head(model) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A causal LM's transformer body (hidden states) and its LM head; peft's LoRA layers live
    inside the body, so an active or disabled adapter applies as it does to the whole model."""
    causal = model.get_base_model() if hasattr(model, "get_base_model") else model
    return causal.get_decoder(), causal.get_output_embeddings()


@torch.no_grad()
def check_head_decomposition(model) -> None:
    """Scoring through body then head is exact only when the model's logits are nothing more than
    ``head(body(x))``; a model that soft-caps, scales or otherwise edits its logits would be scored
    against a distribution it never sampled from, so it is refused here, once, on a 4-token input."""
    body, head = body_and_head(model)
    was_training = model.training
    model.eval()
    try:
        ids = torch.arange(4, device=head.weight.device)[None]
        whole = model(input_ids=ids).logits
        split = head(body(input_ids=ids).last_hidden_state)
    finally:
        model.train(was_training)
    if not torch.allclose(whole, split, atol=1e-5, rtol=1e-5):
        raise ValueError(
            f"{type(model).__name__}'s logits are not its LM head applied to its final hidden states "
            f"(max difference {float((whole - split).abs().max()):.3g}); the learner scores tokens that way, "
            "so this model is not supported for training"
        )


def token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float = 1.0,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``hidden`` [N, H], head ``weight`` [V, H] and ``bias`` [V] (or None), ``targets`` [N] ->
    (log-probs [N], entropies [N]). Entropies carry a gradient only when ``entropy_grad`` (the
    entropy bonus needs it)."""
    head_trains = weight.requires_grad or (bias is not None and bias.requires_grad)
    if not torch.is_grad_enabled() or not (hidden.requires_grad or head_trains):
        with torch.no_grad():
            return _scores(hidden, weight, bias, targets, temperature, factor=None)
    if entropy_grad or head_trains:
        return _autograd_scores(hidden, weight, bias, targets, temperature)
    return _FrozenHeadLogProbs.apply(hidden, weight, bias, targets, temperature)


def _logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float) -> torch.Tensor:
    z = F.linear(hidden, weight, bias).float()  # a bf16 model's logits, softmaxed in fp32 as at sampling
    return z / temperature if temperature != 1.0 else z


def _scores(hidden, weight, bias, targets, temperature, factor: torch.Tensor | None):
    """Chunked log-probs and entropies; fills ``factor`` [N, H] with (W_y - p W) / T when given.
    Two [CHUNK_ROWS, V] buffers serve every chunk (fresh ones per chunk would each be new pages
    the kernel has to fault in and zero)."""
    n = hidden.shape[0]
    logp = hidden.new_empty(n, dtype=torch.float32)
    entropy = hidden.new_empty(n, dtype=torch.float32)
    rows_max = min(CHUNK_ROWS, n)
    z_buf = hidden.new_empty(rows_max, weight.shape[0], dtype=torch.float32)
    p_buf = torch.empty_like(z_buf)
    for start in range(0, n, CHUNK_ROWS):
        rows = slice(start, min(start + CHUNK_ROWS, n))
        m = rows.stop - start
        z, p = z_buf[:m], p_buf[:m]
        if hidden.dtype == torch.float32:
            torch.mm(hidden[rows], weight.t(), out=z)
            if bias is not None:
                z.add_(bias)
        else:
            z.copy_(F.linear(hidden[rows], weight, bias))
        if temperature != 1.0:
            z.div_(temperature)
        # logsumexp and the softmax from one exp pass: p = exp(z - max) / sum, lse = max + log(sum).
        # The far tail is floored as at sampling (TAIL_FLOOR_NATS): its subnormal exps would slow
        # this pass and the p @ W product ~20x and change no drawable token's log-prob.
        top = z.amax(dim=-1, keepdim=True)
        torch.sub(z, top, out=p).clamp_(min=-TAIL_FLOOR_NATS).exp_()
        total = p.sum(dim=-1, keepdim=True)
        p.div_(total)
        lse = (top + total.log()).squeeze(1)
        y = targets[rows]
        logp[rows] = z.gather(1, y[:, None]).squeeze(1) - lse
        if factor is not None:
            factor[rows] = (weight[y].float() - p @ weight.float()) / temperature
        entropy[rows] = lse - p.mul_(z).sum(-1)  # sum_v p_v (lse - z_v)
    return logp, entropy


class _FrozenHeadLogProbs(torch.autograd.Function):
    """Log-probs with the closed-form gradient for a frozen head (module docstring); entropies have none."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature):
        factor = torch.empty_like(hidden, dtype=torch.float32)
        ctx.dtype = hidden.dtype
        logp, entropy = _scores(hidden, weight, bias, targets, temperature, factor)
        ctx.save_for_backward(factor)
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        (factor,) = ctx.saved_tensors
        return (grad_logp[:, None] * factor).to(ctx.dtype), None, None, None, None


def _autograd_scores(hidden, weight, bias, targets, temperature):
    logps, entropies = [], []
    for start in range(0, hidden.shape[0], CHUNK_ROWS):
        rows = slice(start, start + CHUNK_ROWS)
        logp_all = torch.log_softmax(_logits(hidden[rows], weight, bias, temperature), dim=-1)
        logps.append(logp_all.gather(1, targets[rows, None]).squeeze(1))
        entropies.append(-(logp_all.exp() * logp_all).sum(-1))
    return torch.cat(logps), torch.cat(entropies)
