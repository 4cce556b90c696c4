"""Sampling one token per row from next-token logits, with the log-prob and entropy the learner needs.

Per docs/interfaces.md, a token's log-prob is taken from the temperature-scaled full distribution
(before top-p), so the learner can recompute it exactly from a forward pass. Each row uses exactly
one uniform number per token, drawn from the row's own generator when it has one (per-episode
seeds), so a row samples the same tokens whichever rows share its batch.

Where the machine can compile it (``backends.kernels``), a C++ op (``sample_rows.cpp``) does the
whole step in two passes over each row's vocabulary: the same definitions, the sums in another
order. ``bench/sampling.py`` times both; ``compiled=False`` (or no compiler) runs the torch path.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from scope_marl.backends import kernels
from scope_marl.backends.base import SamplingParams

NUCLEUS_CANDIDATES = 256  # top-p looks at this many best tokens first; a full sort only if they fall short
# Scaled logits more than this far below a row's best are raised to it before the softmax. Without
# the floor, exp() of the far tail lands in fp32's subnormal range (below e^-87), which x86 CPUs
# compute many times slower (bench/sampling.py; low temperatures and peaked rows put a large part of
# the vocabulary that far down). A floored token keeps a probability under e^-70 (~4e-31): a row's
# normalizer moves by less than 2e-26, far below fp32's resolution, so every token that can be
# drawn keeps its log-prob to the bit. The learner floors the same way (training.token_logprobs).
TAIL_FLOOR_NATS = 70.0


def compiled_sampler():
    """The compiled ``sample_rows`` op, or ``None`` (one warning) where it cannot be built."""
    return kernels.load("sample_rows", "sampling runs on torch's ops (same results, slower sampling)")


def sample_next(
    logits: torch.Tensor,
    sampling: SamplingParams,
    generator: torch.Generator | Sequence[torch.Generator] | None,
    compiled: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample one token per row. Returns (ids, log-probs, entropies) per the log-prob definition in docs/interfaces.md.

    ``generator`` is one stream for the whole batch, or one per row (per-episode seeds: a row's draws
    then do not depend on its neighbours). Each row uses exactly one uniform number per token.
    ``compiled``: the compiled op where it builds (CPU logits, temperature > 0), else torch's ops.
    """
    greedy = sampling.temperature == 0.0
    if not greedy and compiled and logits.device.type == "cpu" and (op := compiled_sampler()) is not None:
        u = _uniforms(logits.shape[0], generator)
        return op(logits.float().contiguous(), sampling.temperature, sampling.top_p, TAIL_FLOOR_NATS, u)
    scaled = logits.float() / (1.0 if greedy else sampling.temperature)
    scaled.clamp_(min=scaled.amax(-1, keepdim=True) - TAIL_FLOOR_NATS)  # scaled is a fresh tensor
    logp = torch.log_softmax(scaled, dim=-1)
    probs = logp.exp()
    entropy = -(probs * logp).sum(-1)
    if greedy:
        ids = logp.argmax(-1)
    else:
        u = _uniforms(probs.shape[0], generator).to(probs.device)  # drawn on the CPU: the same numbers on every device
        if sampling.top_p < 1.0:
            ids = _sample_nucleus(probs, sampling.top_p, u)
        else:
            ids = _sample_inverse_cdf(probs, torch.arange(probs.shape[-1], device=probs.device).expand_as(probs), u)
    return ids, logp.gather(-1, ids[:, None]).squeeze(-1), entropy


def _uniforms(rows: int, generator: torch.Generator | Sequence[torch.Generator] | None) -> torch.Tensor:
    """One uniform number per row: from the row's own generator, or ``rows`` from the shared one."""
    if isinstance(generator, Sequence):
        return torch.cat([torch.rand(1, generator=g) for g in generator])
    return torch.rand(rows, generator=generator)


def _sample_inverse_cdf(weights: torch.Tensor, token_ids: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Draw one column per row in proportion to ``weights`` (unnormalized), row i at uniform ``u[i]``.

    One uniform number per row and a binary search over the running sum: ``torch.multinomial``
    draws an exponential variate per vocabulary entry, which costs more than the LM head here.
    """
    cdf = weights.cumsum(-1)
    col = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True).clamp(max=weights.shape[-1] - 1)
    return token_ids.gather(-1, col).squeeze(-1)


def _sample_nucleus(probs: torch.Tensor, top_p: float, u: torch.Tensor) -> torch.Tensor:
    """Top-p: keep the smallest set of most likely tokens whose mass reaches ``top_p`` (the top token always).

    The nucleus is almost always inside the few hundred best tokens, so ``topk`` replaces a full
    vocabulary sort; rows whose candidates do not reach ``top_p`` get the exact full sort (with the
    same uniform number).
    """
    k = min(NUCLEUS_CANDIDATES, probs.shape[-1])
    best, order = probs.topk(k, dim=-1)
    ids = _sample_inverse_cdf(best * ((best.cumsum(-1) - best) < top_p), order, u)
    short = (best.sum(-1) < top_p).nonzero().squeeze(-1)
    if len(short) and k < probs.shape[-1]:
        best, order = probs[short].sort(-1, descending=True)
        ids[short] = _sample_inverse_cdf(best * ((best.cumsum(-1) - best) < top_p), order, u[short])
    return ids
