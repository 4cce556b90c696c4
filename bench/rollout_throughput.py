"""Rollout throughput on the embedded SmolLM2-135M (fp32, CPU): naive HF loop vs the engine vs the FLOP bound.

Workload: two-role episodes of the built-in environment, 4 exchanges (8 turns), at most 48 new
tokens a turn (a turn cut at 48 tokens is kept and play goes on, so every episode has 8 turns).
Both roles run on the same model, as in self-play / co-training.

  (a) naive: one `model.generate` call per episode per turn, prompt re-encoded from text each time.
  (b) engine: RolloutEngine with 8, 32 and 64 concurrent episodes (one wave each).
  (c) bound: measured fp32 GEMM rate (2048 x 2048 matmul, this run) / (2 x all parameters,
      tied embedding included) = generated tokens/s if every FLOP were a useful GEMM FLOP.
  (d) roofline: also the memory read bandwidth (a sum over a buffer 4x the last-level cache, this
      run). For the workload each engine run actually played, a perfect implementation needs: every
      decode step the engine ran, batched at min(64, its live rows), each taking the larger of its
      FLOP time (2 x params + attention over the context, per row) and its bytes time (every fp32
      weight, LM head included, read once, plus the KV cache its rows attended over, 46,080 bytes a
      column for SmolLM2-135M in fp32, counted by the engine for both roles' rows at every step);
      plus the prefilled tokens at the GEMM rate. An episode's turns are sequential, so the live rows
      per step are the workload's (8 turns of up to 48 tokens need ~384 steps however the batch is
      run), not 64 always. roofline_fraction = that time / the engine's whole wall time (templating,
      sampling and bookkeeping included). "mean ctx" = the mean columns a decoding row attended over.
  (e) vLLM: when its venv exists (``scope serve vllm --install-only``) or --vllm-url names a running
      server, the RESULT run's episodes (same tasks, seeds and sampling) are played again with both
      roles on a vLLM CPU server, after every local run; the ``VLLM`` line gives both tok/s.

Run: python bench/rollout_throughput.py [--quick] [--sizes 64] [--vllm auto|yes|no] [--vllm-url URL]
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import torch

from scope_marl.backends import rows_attention
from scope_marl.backends.base import BackendError
from scope_marl.backends.embedded import load_embedded
from scope_marl.backends.seat import Seat
from scope_marl.backends.vllm_server import default_venv, has_vllm, running_server
from scope_marl.config import RolloutConfig
from scope_marl.core.machine import cpu_isa, cpu_slug, gemm_gflops, last_level_cache_bytes, memory_read_gbps
from scope_marl.core.types import Message, SamplingParams
from scope_marl.envs import AGENT, SayTheWord, role_view
from scope_marl.rollout import RolloutEngine
from scope_marl.simulators import FrozenSimulator

EXCHANGES = 4
NEW_TOKENS = 48
SAMPLING = SamplingParams(temperature=0.7, top_p=0.95, max_new_tokens=NEW_TOKENS)


class FixedLength(SayTheWord):
    """The built-in environment without its early ending: every episode plays all its exchanges."""

    def is_done(self, task, messages) -> bool:
        return len(messages) >= 2 * self.max_exchanges


def naive(chat, env, tasks) -> tuple[int, float]:
    """The loop people write first: HF generate per episode per turn, full prompt every time."""
    tok, model = chat.tokenizer, chat.model
    tokens, started = 0, time.perf_counter()
    for task in tasks:
        messages: list[Message] = []
        role = AGENT
        for _ in range(2 * EXCHANGES):
            view = role_view(messages, role, env.system_prompt(task, role))
            ids = torch.tensor([chat.encode_chat(view)])
            with torch.no_grad():
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=True,
                    temperature=SAMPLING.temperature,
                    top_p=SAMPLING.top_p,
                    max_new_tokens=NEW_TOKENS,
                    eos_token_id=list(chat.stop_ids),
                    pad_token_id=chat.pad_id,
                )
            new = out[0, ids.shape[1] :].tolist()
            tokens += len(new)
            messages.append(Message(role=role, content=tok.decode(new, skip_special_tokens=True)))
            role = env.other(role)
    return tokens, time.perf_counter() - started


def make_engine(model, env, concurrent: int, seed: int) -> tuple[RolloutEngine, list]:
    """The engine and tasks of one run: ``concurrent`` episodes, both roles on ``model``."""
    group_size = 4 if concurrent >= 16 else 1  # GRPO-shaped: several rollouts per task
    tasks = env.tasks("train")[: concurrent // group_size]
    simulator = FrozenSimulator(model, SAMPLING, simulator_id="frozen-self")
    config = RolloutConfig(group_size=group_size, max_concurrent=concurrent, seed=seed, on_turn_limit="continue", progress=False)
    return RolloutEngine(env, Seat(model=model, sampling=SAMPLING, trainable=True), simulator, config), tasks


def vllm_tok_s(url: str, env, concurrent: int, seed: int) -> float:
    """Generated tok/s of the same episodes (tasks, seeds, sampling) with both roles on a vLLM server."""
    from scope_marl.backends import load_backend

    remote = load_backend(f"vllm:embedded@{url}")
    remote.generate_ids([[1, 2, 3]], SAMPLING.model_copy(update={"max_new_tokens": 4}))  # warm-up, untimed
    engine, tasks = make_engine(remote, env, concurrent, seed)
    episodes = engine.run(tasks)
    assert len(episodes) == concurrent, "every episode must finish"
    return engine.stats.generated_tokens / engine.stats.seconds


def engine_run(chat, env, concurrent: int, seed: int) -> dict:
    engine, tasks = make_engine(chat, env, concurrent, seed)
    hits, misses = chat.prefix_cache.hits, chat.prefix_cache.misses
    before, steps_before, columns_before = dict(chat.timings), chat.steps_by_rows.copy(), chat.columns_by_rows.copy()
    episodes = engine.run(tasks)
    turns = sum(len(e.messages) for e in episodes)
    assert turns == len(episodes) * 2 * EXCHANGES == concurrent * 2 * EXCHANGES, "every episode must play all its turns"
    prefilled = chat.prefix_cache.misses - misses
    phases = {k: chat.timings[k] - before[k] for k in before}
    r = {
        **phases,
        "episodes": len(episodes),
        "tokens": engine.stats.generated_tokens,
        "seconds": engine.stats.seconds,
        "prefilled": prefilled,
        "reused": chat.prefix_cache.hits - hits,
        "calls": engine.stats.model_calls,
        "steps_by_rows": chat.steps_by_rows - steps_before,
        "columns_by_rows": chat.columns_by_rows - columns_before,
    }
    r["decode_rows"] = sum(rows * n for rows, n in r["steps_by_rows"].items())  # rows decoded, over every step
    return r


def perfect_seconds(r: dict, params: int, cfg, gflops: float, gbps: float) -> float:
    """What a perfect implementation needs for run ``r``'s workload (module docstring, (d))."""
    layers, width = cfg.num_hidden_layers, cfg.hidden_size
    head_dim = getattr(cfg, "head_dim", None) or width // cfg.num_attention_heads
    kv_bytes = 2 * layers * cfg.num_key_value_heads * head_dim * 4  # K and V, fp32
    decode = 0.0
    for live, steps in r["steps_by_rows"].items():
        rows = min(64, live)
        ctx = r["columns_by_rows"][live] / (steps * live)  # the mean columns a row of these steps attended over
        step_flops = rows * (2 * params + 4 * layers * width * ctx)
        step_bytes = 4 * params + rows * ctx * kv_bytes
        decode += steps * max(step_flops / (gflops * 1e9), step_bytes / (gbps * 1e9))
    prefill = r["prefilled"] * 2 * params / (gflops * 1e9)
    return decode + prefill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer episodes (a smoke run, not a measurement)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--naive-episodes", type=int, default=2)
    parser.add_argument("--sizes", type=int, nargs="+", help="concurrency levels to run (default 8 32 64 128; the RESULT line reports 64)")
    parser.add_argument(
        "--vllm",
        choices=["auto", "yes", "no"],
        default="auto",
        help="also play the RESULT run's episodes on vLLM (auto: when its venv has it)",
    )
    parser.add_argument("--vllm-venv", type=Path, default=default_venv("cpu"), help="vLLM's venv (scope serve vllm --install-only)")
    parser.add_argument("--vllm-url", default=None, help="a running vLLM server serving the embedded model as 'embedded'")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    chat = load_embedded()
    params = sum(p.numel() for p in chat.model.parameters())  # tied embedding / LM head counted once
    gflops = gemm_gflops(repeats=20)
    gbps = memory_read_gbps()
    bound = gflops * 1e9 / (2 * params)
    env = FixedLength(num_tasks=32, max_exchanges=EXCHANGES)  # 128 concurrent = 32 tasks x groups of 4
    sizes = args.sizes or ([4, 8] if args.quick else [8, 32, 64, 128])

    naive_tasks = env.tasks("train")[: 1 if args.quick else args.naive_episodes]
    naive_tokens, naive_s = naive(chat, env, naive_tasks)
    naive_tok_s = naive_tokens / naive_s

    print(f"model: SmolLM2-135M-Instruct fp32, {params / 1e6:.1f}M parameters, {args.threads} threads")
    print(f"GEMM 2048x2048 fp32: {gflops:.1f} GFLOP/s -> FLOP bound {bound:.1f} generated tok/s")
    print(f"memory read: {gbps:.1f} GB/s (buffer {4 * last_level_cache_bytes() / 2**20:.0f} MiB = 4x the last-level cache)")
    print(f"decode attention: {'compiled rows_attention op' if rows_attention.load() else 'SDPA (the op could not be built)'}")
    print(f"workload: {EXCHANGES} exchanges, <= {NEW_TOKENS} new tokens a turn, T={SAMPLING.temperature}, top_p={SAMPLING.top_p}")
    print()
    header = f"{'run':<12}{'episodes':>9}{'gen tokens':>11}{'seconds':>9}{'tok/s':>9}{'x naive':>9}{'of bound':>9}{'prefill tok':>12}{'reused tok':>11}"
    print(header)
    print("-" * len(header))
    print(
        f"{'naive HF':<12}{len(naive_tasks):>9}{naive_tokens:>11}{naive_s:>9.1f}{naive_tok_s:>9.1f}{1.0:>9.2f}{naive_tok_s / bound:>9.3f}{'-':>12}{'-':>11}"
    )
    runs = {}
    for i, size in enumerate(sizes):
        r = runs[size] = engine_run(chat, env, size, seed=i)
        r["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # so far: the runs up to this size
        engine_tok_s = r["tokens"] / r["seconds"]
        print(
            f"{'engine@' + str(size):<12}{r['episodes']:>9}{r['tokens']:>11}{r['seconds']:>9.1f}{engine_tok_s:>9.1f}"
            f"{engine_tok_s / naive_tok_s:>9.2f}{engine_tok_s / bound:>9.3f}{r['prefilled']:>12}{r['reused']:>11}"
        )
    print()
    print(
        "where the engine's time goes (seconds; a step's forward is split between prefill and decode by tokens; "
        "kv copy = key/value states copied between slots: a conversation's turns share one slot, so only spills "
        "(no free slot left) and identical first prompts copied from the one prefilled; decode rows/step = mean rows per step)"
    )
    print(
        f"{'run':<12}{'total':>8}{'prefill':>9}{'decode':>9}{'sample':>9}{'kv copy':>9}{'other':>8}{'steps':>7}{'rows/step':>10}{'ms/step':>9}"
    )
    for size, r in runs.items():
        other = r["seconds"] - r["prefill_s"] - r["decode_s"] - r["sample_s"] - r["copy_s"]
        decode_steps = r["steps_by_rows"].total()
        steps = max(decode_steps, 1)
        print(
            f"{'engine@' + str(size):<12}{r['seconds']:>8.1f}{r['prefill_s']:>9.1f}{r['decode_s']:>9.1f}{r['sample_s']:>9.1f}"
            f"{r['copy_s']:>9.1f}{other:>8.1f}{decode_steps:>7}{r['decode_rows'] / steps:>10.1f}{1000 * r['decode_s'] / steps:>9.1f}"
        )
    print()
    print(
        "roofline: a perfect implementation's time for the same workload (each decode step at min(64, its live rows), prefill at the GEMM rate)"
    )
    print(f"{'run':<12}{'mean ctx':>9}{'prefilled':>10}{'perfect s':>10}{'engine s':>9}{'roofline':>9}{'FLOP-only':>10}")
    for size, r in runs.items():
        r["perfect_s"] = perfect_seconds(r, params, chat.model.config, gflops, gbps)
        mean_context = r["columns_by_rows"].total() / max(r["decode_rows"], 1)
        print(
            f"{'engine@' + str(size):<12}{mean_context:>9.0f}{r['prefilled']:>10}{r['perfect_s']:>10.1f}{r['seconds']:>9.1f}"
            f"{r['perfect_s'] / r['seconds']:>9.3f}{r['tokens'] / r['seconds'] / bound:>10.3f}"
        )
    at = 64 if 64 in runs else max(runs)  # the RESULT line reports 64 concurrent episodes (--quick: its largest)
    r = runs[at]
    engine_tok_s = r["tokens"] / r["seconds"]
    print()
    use_vllm = args.vllm == "yes" or (args.vllm == "auto" and (args.vllm_url is not None or has_vllm(args.vllm_venv)))
    if use_vllm:
        # After every local run, so the server never competes with the engine for the cores; its start-up is not timed.
        with running_server(args.vllm_url, args.vllm_venv) as url:
            remote = vllm_tok_s(url, env, at, seed=sizes.index(at))
        print(f"VLLM concurrent={at} engine_tok_s={engine_tok_s:.2f} vllm_tok_s={remote:.2f} engine_over_vllm={engine_tok_s / remote:.2f}")
    else:
        print(f"vLLM: not measured (no vLLM in {args.vllm_venv}; `scope serve vllm --install-only`, or --vllm-url)")
    print(
        f"RESULT naive_tok_s={naive_tok_s:.2f} engine_tok_s={engine_tok_s:.2f} ratio={engine_tok_s / naive_tok_s:.2f} "
        f"bound_fraction={engine_tok_s / bound:.3f} roofline_fraction={r['perfect_s'] / r['seconds']:.3f} peak_rss_mb={r['peak_rss_mb']} "
        f"cpu={cpu_slug()} isa={cpu_isa()}"
    )


if __name__ == "__main__":
    try:
        main()
    except BackendError as error:  # the server would not start or answer: say why, no traceback
        raise SystemExit(f"error: {error}") from None
