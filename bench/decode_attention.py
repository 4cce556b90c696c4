"""Decode attention: the compiled rows_attention op against torch's SDPA on one continuous-batching step.

The step's shape is the rollout bench's at 64 concurrent episodes: 47 of 64 slots decoding, each
row with its own length (uniform in [20, 400), mean about 210 columns), SmolLM2-135M's 9 query heads
over 3 key/value heads of 64 dims, fp32. Each of the model's 30 layers has its own cache buffers, so
the caches stream from memory as in a real step instead of sitting in the last-level cache.

  sdpa: what the cache does without the op: one SDPA call over slots [0, n) up to the longest row,
        each row masked to its own length (grouped heads packed per key/value head, no copy).
  op:   backends.rows_attention: each row over exactly its own columns.

Both compute the same numbers (the max difference is printed). Bytes = the K and V columns the rows
attend over (what a perfect kernel must read); GB/s = those bytes / time, beside the machine's read
bandwidth measured in the same run.

--rollout N: then the rollout bench's workload at 64 concurrent episodes (bench/rollout_throughput.py),
N times each way, alternating op / SDPA in one process so both see the same machine (a shared
host's speed drifts by more than the difference between runs minutes apart).

Run: python bench/decode_attention.py [--rows 47] [--repeats 20] [--rollout 2]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from scope_marl.backends.rows_attention import load
from scope_marl.core.machine import gemm_gflops, memory_read_gbps

LAYERS, SLOTS, KV_HEADS, HEADS, DIM, COLUMNS = 30, 64, 3, 9, 64, 600


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=47, help="decoding rows of the 64 slots")
    parser.add_argument("--repeats", type=int, default=20, help="passes over the 30 layers per timing")
    parser.add_argument("--rollout", type=int, default=0, help="also play the rollout bench's 64 episodes this many times each way")
    args = parser.parse_args()
    op = load()
    if op is None:
        raise SystemExit("the decode-attention op could not be built here (see the warning above); nothing to compare")
    torch.manual_seed(0)
    keys = [torch.randn(SLOTS, KV_HEADS, COLUMNS, DIM) for _ in range(LAYERS)]
    values = [torch.randn(SLOTS, KV_HEADS, COLUMNS, DIM) for _ in range(LAYERS)]
    slot = torch.randperm(SLOTS)[: args.rows].sort().values
    visible = torch.randint(20, 400, (args.rows,))
    query = torch.randn(args.rows, HEADS, DIM)
    scale = DIM**-0.5

    # SDPA's layout: slots [0, region) up to the longest row, queries placed at their slots, masked.
    region, span = int(slot.max()) + 1, int(visible.max())
    lengths = torch.zeros(region, dtype=torch.long).index_copy_(0, slot, visible)
    mask = (torch.arange(span)[None, :] < lengths.clamp(min=1)[:, None])[:, None, None, :]
    placed = torch.zeros(region, HEADS, DIM).index_copy_(0, slot, query).reshape(region, KV_HEADS, HEADS // KV_HEADS, DIM)

    def sdpa(layer: int) -> torch.Tensor:
        out = F.scaled_dot_product_attention(
            placed, keys[layer][:region, :, :span], values[layer][:region, :, :span], attn_mask=mask, scale=scale
        )
        return out.reshape(region, HEADS, DIM).index_select(0, slot)

    def compiled(layer: int) -> torch.Tensor:
        return op(query, keys[layer], values[layer], slot, visible, scale)

    difference = max(float((sdpa(layer) - compiled(layer)).abs().max()) for layer in range(LAYERS))
    useful = int(visible.sum()) * KV_HEADS * DIM * 4 * 2  # K and V bytes a step's rows attend over, per layer
    gbps, gflops = memory_read_gbps(), gemm_gflops()
    print(
        f"{args.rows} of {SLOTS} slots decoding, mean {float(visible.float().mean()):.0f} columns a row (longest {span}); {LAYERS} layers"
    )
    print(f"memory read {gbps:.1f} GB/s, GEMM {gflops:.1f} GFLOP/s, {torch.get_num_threads()} threads; max |op - sdpa| = {difference:.1e}")
    print()
    print(f"{'path':<6}{'ms/layer':>10}{'GB/s':>8}{'of read bw':>12}")
    best = {}
    for name, fn in (("sdpa", sdpa), ("op", compiled)):
        for layer in range(LAYERS):
            fn(layer)  # warm-up
        best[name] = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(args.repeats):
                for layer in range(LAYERS):
                    fn(layer)
            best[name] = min(best[name], (time.perf_counter() - start) / (args.repeats * LAYERS))
        rate = useful / best[name] / 1e9
        print(f"{name:<6}{1e3 * best[name]:>10.3f}{rate:>8.1f}{rate / gbps:>12.2f}")
    if args.rollout:
        rollout_ab(args.rollout)
    print()
    print(
        f"RESULT sdpa_ms={1e3 * best['sdpa']:.3f} op_ms={1e3 * best['op']:.3f} speedup={best['sdpa'] / best['op']:.2f} "
        f"op_bandwidth_fraction={useful / best['op'] / 1e9 / gbps:.2f} max_abs_diff={difference:.1e}"
    )


def rollout_ab(times: int) -> None:
    import rollout_throughput as bench  # this script's folder is on sys.path

    from scope_marl.backends.embedded import load_embedded

    chat = load_embedded()
    env = bench.FixedLength(num_tasks=32, max_exchanges=bench.EXCHANGES)
    bench.engine_run(chat, env, 8, seed=5)  # warm-up: packing calibration, first allocations
    print()
    print(f"rollout bench workload, 64 concurrent episodes, alternating in one process; GEMM {gemm_gflops():.1f} GFLOP/s at the start")
    print(f"{'path':<6}{'seconds':>9}{'decode s':>10}{'prefill s':>11}{'tok/s':>8}")
    totals = {"op": [], "sdpa": []}
    for _ in range(times):
        for name in ("op", "sdpa"):
            chat.compiled_attention = name == "op"
            r = bench.engine_run(chat, env, 64, seed=2)
            totals[name].append(r["tokens"] / r["seconds"])
            print(f"{name:<6}{r['seconds']:>9.1f}{r['decode_s']:>10.1f}{r['prefill_s']:>11.1f}{totals[name][-1]:>8.1f}", flush=True)
    mean = {name: sum(v) / len(v) for name, v in totals.items()}
    print(f"rollout tok/s, mean: op {mean['op']:.1f}, sdpa {mean['sdpa']:.1f}, ratio {mean['op'] / mean['sdpa']:.2f}")


if __name__ == "__main__":
    main()
