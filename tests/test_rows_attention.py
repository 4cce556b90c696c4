"""The compiled decode-attention op against torch's SDPA: same numbers, clear errors, a clear build failure."""

from __future__ import annotations

import pytest
import torch

from scope_marl.backends.kv_cache import RowCache

LAYERS, KV_HEADS, HEADS, DIM = 2, 3, 9, 64


@pytest.fixture
def op(rows_attention_op):
    return rows_attention_op


def _filled_pair(lengths: list[int], columns: int) -> tuple[RowCache, RowCache]:
    """Two caches (compiled op / SDPA) holding the same random states, slot ``i`` of length ``lengths[i]``."""
    generator = torch.Generator().manual_seed(0)
    caches = (RowCache(LAYERS, KV_HEADS, DIM, torch.float32, "cpu"), RowCache(LAYERS, KV_HEADS, DIM, torch.float32, "cpu", compiled=False))
    states = [
        (
            [torch.randn(KV_HEADS, n, DIM, generator=generator) for _ in range(LAYERS)],
            [torch.randn(KV_HEADS, n, DIM, generator=generator) for _ in range(LAYERS)],
        )
        for n in lengths
    ]
    for cache in caches:
        cache.reserve(len(lengths), columns)
        for slot, (keys, values) in enumerate(states):
            if lengths[slot]:
                cache.put(slot, keys, values, lengths[slot])
    return caches


def test_cache_uses_the_op_only_when_asked(op):
    compiled, reference = _filled_pair([3], 8)
    assert compiled.rows_attention is op and reference.rows_attention is None


@pytest.mark.parametrize("decode", [[0, 1, 2, 3, 4, 5], [5, 1, 3]], ids=["all-slots", "scattered-slots"])
def test_decode_step_matches_sdpa_with_a_prefill_chunk_beside_it(op, decode):
    lengths = [1, 700, 37, 0, 255, 64]  # slot 3 is empty: only a chunk writes it
    compiled, reference = _filled_pair(lengths, 800)
    chunk = (3, 0, 5)
    tokens = len(decode) + chunk[2]
    generator = torch.Generator().manual_seed(1)
    query = torch.randn(tokens, HEADS, 1, DIM, generator=generator)
    new_keys = [torch.randn(tokens, KV_HEADS, 1, DIM, generator=generator) for _ in range(LAYERS)]
    new_values = [torch.randn(tokens, KV_HEADS, 1, DIM, generator=generator) for _ in range(LAYERS)]
    outputs = []
    for cache in (compiled, reference):
        cache.begin_step(decode, [chunk])
        outputs.append([])
        for layer in range(LAYERS):
            cache.update(new_keys[layer], new_values[layer], layer)
            outputs[-1].append(cache.attend(layer, query, None))
        cache.end_step()
    for ours, theirs in zip(*outputs):
        assert ours.shape == (tokens, 1, HEADS, DIM)
        torch.testing.assert_close(ours, theirs, atol=2e-6, rtol=1e-5)
    assert torch.equal(compiled.lengths, reference.lengths)


@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (8, 4, 64), (8, 2, 32)], ids=["smollm2", "group-2", "dim-32"])
def test_every_head_shape_matches_sdpa(op, heads, kv_heads, dim):
    """The common shape runs a compile-time specialization, the others the general loops: both exact."""
    generator = torch.Generator().manual_seed(2)
    keys = torch.randn(5, kv_heads, 300, dim, generator=generator)
    values = torch.randn(5, kv_heads, 300, dim, generator=generator)
    query = torch.randn(4, heads, dim, generator=generator)
    slot, visible = torch.tensor([4, 0, 2, 0]), torch.tensor([300, 1, 123, 77])
    ours = op(query, keys, values, slot, visible, dim**-0.5)
    for t in range(4):
        n = int(visible[t])
        k = keys[slot[t], :, :n].repeat_interleave(heads // kv_heads, dim=0)
        v = values[slot[t], :, :n].repeat_interleave(heads // kv_heads, dim=0)
        reference = torch.nn.functional.scaled_dot_product_attention(query[t][:, None], k, v)[:, 0]
        torch.testing.assert_close(ours[t], reference, atol=2e-6, rtol=1e-5)


def test_each_row_sees_exactly_its_own_columns(op):
    """A row's output must not move when columns past its length change (they are someone's padding)."""
    keys = torch.randn(2, KV_HEADS, 50, DIM)
    values = torch.randn(2, KV_HEADS, 50, DIM)
    query = torch.randn(2, HEADS, DIM)
    slot, visible = torch.tensor([0, 1]), torch.tensor([10, 50])
    before = op(query, keys, values, slot, visible, 0.125)
    keys[0, :, 10:] = 1e4
    values[0, :, 10:] = float("nan")
    after = op(query, keys, values, slot, visible, 0.125)
    assert torch.equal(before, after)
    assert not torch.equal(op(query, keys, values, slot, torch.tensor([11, 50]), 0.125)[0], before[0])


def test_a_length_outside_the_cache_is_a_clear_error(op):
    keys = values = torch.zeros(1, KV_HEADS, 4, DIM)
    with pytest.raises(RuntimeError, match="outside the cache"):
        op(torch.zeros(1, HEADS, DIM), keys, values, torch.tensor([0]), torch.tensor([5]), 1.0)
