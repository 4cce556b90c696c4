"""Grouped-query attention through torch's SDPA without copying key/value heads.

SmolLM2 has 9 query heads sharing 3 key/value heads. Given an attention mask with more than one
query, transformers' ``sdpa`` attention on CPU repeats each key/value head 3 times first (only its
single-query path avoids that): a copy of every layer's cached keys and values per forward pass,
3x their size. torch's SDPA takes grouped heads itself (``enable_gqa``), so that case goes straight
to it; every other case is transformers' own ``sdpa``. Same kernel, same numbers, no copy.

A continuous-batching step (``backends.kv_cache``) passes its cache as ``kv_slots``: the cache
then computes each token's attention over that token's own slot.
"""

from __future__ import annotations

import torch.nn.functional as F

NAME = "sdpa_gqa"


def sdpa_gqa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    slots = kwargs.get("kv_slots")
    if slots is not None:  # a packed continuous-batching step: each token attends over its own cache slot
        return slots.attend(module.layer_idx, query, scaling), None

    grouped = key.shape[1] != query.shape[1]
    if not grouped or query.shape[2] == 1 or attention_mask is None or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if kwargs.get("softcap") is not None:
        raise ValueError("sdpa attention does not support softcap; load the model with another attention implementation")
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def use_sdpa_gqa(model) -> None:
    """Switch a transformers model that runs ``sdpa`` attention to :func:`sdpa_gqa_attention`
    (eager, flash or a user's own choice stays). Also makes :data:`NAME` known to transformers in
    this process, which a process that unpickled an already switched model needs."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, sdpa_gqa_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(NAME)
