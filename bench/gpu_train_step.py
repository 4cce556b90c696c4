"""GRPO steps (generation + update) on randomly initialised models: ours vs TRL's GRPOTrainer, same model, batch
and device, in one run. On a GPU in bfloat16 (three shapes), on the CPU in float32 (the 135M shape).

Models are built from transformers configs only (no weights, no network), seeded, so both sides start from the
same weights: AutoModelForCausalLM.from_config(cfg) in float32 on the device, then .to(dtype).

  smollm2-135m   LlamaConfig as backends/embedded.py's read_gguf_llama makes it: hidden 576, 30 layers, 9 heads
                 (head dim 64), 3 kv heads, intermediate 1536, vocab 49152, tied embeddings, rope theta 1e5
  qwen2.5-0.5b   Qwen2Config of Qwen2.5-0.5B: hidden 896, 24 layers, 14 heads, 2 kv heads, intermediate 4864,
                 vocab 151936, tied embeddings, rope theta 1e6 (494M parameters)
  qwen2.5-1.5b   Qwen2Config of Qwen2.5-1.5B: hidden 1536, 28 layers, 12 heads, 2 kv heads, intermediate 8960,
                 vocab 151936, tied embeddings, rope theta 1e6 (1.54B parameters)

Tokenizer: SmolLM2's (bench/assets/smollm2-tokenizer, 49152 ids) for every shape; bos / eos / pad ids of every
config are set to its ids (1 / 2 / 2). The Qwen shapes keep Qwen's vocabulary of 151936, because the LM head's
FLOPs and memory (a third of the 0.5B model's parameters) are part of what is measured: the model samples ids
above 49151, which the tokenizer's decode skips (only the reward's text would see them; the reward reads ids).
Prompts: random token ids, seeded, drawn from the 31,586 SmolLM2 tokens that are a space plus an ASCII word, so
that their text (what TRL's dataset takes) encodes back to exactly the same ids (checked at start).

Workload, both sides: 8 prompts x 4 samples, 512-token prompts, exactly 256 new tokens per sample (on the CPU the
defaults are 128 and 64, so that a run takes minutes; --prompt-tokens / --new-tokens set any size) (temperature
1.0, top-p 1, no top-k), LoRA r 16 / alpha 32 on every projection with beta (k3 KL to the adapter-free model)
0.01, or full fine-tuning with beta 0 (no reference model); lr 1e-5, clip 0.2 / 0.28, loss "grpo", no reward
std scaling, no gradient checkpointing, one optimizer step per generation batch. No sample ends early: ours
has the model's stop set emptied (chat.stop_ids = set(): a row runs to max_new_tokens, as vLLM's ignore_eos),
TRL gets generation_kwargs min_new_tokens = max_completion_length (the eos logit masked until then). The
sampled distributions differ only in the eos token's share (about 1 / vocab); the token counts are equal.
Reward (per sample, from its ids): the share of even token ids (varies within every group, so every
advantage is non-zero and both updates do their full work).

Timing: the first --warmup steps of each side are not timed (GPU default 1 of 3; CPU 0 of 1). tok/s = generated
tokens / seconds of the timed steps, generation and update; TRL's steps as its callbacks bracket them
(on_step_begin .. on_step_end). ratio = ours_tok_s / trl_tok_s (above 1: ours is faster).

MFU of our update phase alone (Learner.step; the CUDA queue synchronized before the clock is read):

  mfu = update FLOPs / update seconds / R,   R = this device's MEASURED matmul rate in the run's dtype
  (a 8192^3 torch.matmul on the GPU in bf16, the best of 3 rounds; on the CPU, core.machine.gemm_gflops, fp32)

  per update, from the batch's real lengths (P = prompt length, R_i = sample i's response length):
    T_body = sum over distinct prompts of P + sum_i (R_i - 1)    tokens through the transformer body (our learner
                                                                 runs each group's prompt once, as TRL does not)
    T_head = sum_i R_i                                           positions the LM head scores
    pairs  = sum over prompts of P (P + 1) / 2 + sum_i [(R_i - 1) P + (R_i - 1) R_i / 2]
                                                                 (query, key) pairs of causal attention
    N      = weights of the body's linear layers (q k v o gate up down, every layer), V x H = the LM head
    A      = 4 x layers x heads x head_dim x pairs               attention scores and values, one forward
    fwd    = 2 N T_body + 2 V H T_head + A                       one forward
  full fine-tuning:  FLOPs = 3 fwd                              = 6 N T_body + 6 V H T_head + 3 A
      (forward; backward = activation gradients 2N + weight gradients 2N per token, attention 2A)
  LoRA:  FLOPs = 2 fwd + A + 6 N_lora T_body + fwd              = policy forward and the backward's activation
      gradients through the frozen weights (2N + 2N; no weight gradients), the adapters' own 6 N_lora, and the
      reference forward the KL needs (adapters disabled; beta > 0)
  (6 N tokens, the usual count, is the full-fine-tuning line without attention; attention is about 12% of the
  135M shape's FLOPs at 512 + 256 tokens and 3% of the 1.5B shape's.)

Peak memory (peak_gib): torch.cuda.max_memory_allocated over our side's steps on a GPU; on the CPU the process's
peak RSS (VmHWM, reset before our side through /proc/self/clear_refs where Linux allows it, else ru_maxrss).

Output: per shape and mode, as soon as both sides have run, their details and then

  RESULT device=D shape=S mode=lora|full ours_tok_s=A trl_tok_s=B ratio=A/B mfu=M peak_gib=G

and a last summary line  RESULT ratio=MIN_RATIO mfu=MFU_AT_1.5B_FULL  (nan where not run; printed on a kill by
SIGTERM too, for what finished). A side that fails prints its error and reports nan, and the script exits 1;
--budget-s starts no new shape / mode after that many seconds (they report nan).

Needs the bench extra (pip install -e '.[bench]': trl, datasets).
Run: python bench/gpu_train_step.py                       # GPU: all shapes, bf16; CPU: smollm2-135m, fp32
     python bench/gpu_train_step.py --shapes smollm2-135m --modes lora --prompt-tokens 64 --new-tokens 16
"""

from __future__ import annotations

import argparse
import gc
import math
import random
import resource
import signal
import sys
import time
import traceback
from pathlib import Path

import torch
from _trl_grpo import BETA, EPS_HIGH, EPS_LOW, LORA, LR, grpo_episodes, trl_grpo

from scope_marl.backends.hf import HFChatModel
from scope_marl.config import LearnerConfig
from scope_marl.core.machine import gemm_gflops
from scope_marl.core.types import SamplingParams
from scope_marl.envs import AGENT
from scope_marl.training.learner import Learner

TOKENIZER = Path(__file__).resolve().parent / "assets" / "smollm2-tokenizer"
SHAPES = {
    "smollm2-135m": (
        "llama",
        {
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_hidden_layers": 30,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "head_dim": 64,
            "vocab_size": 49152,
            "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
        },
    ),
    "qwen2.5-0.5b": (
        "qwen2",
        {
            "hidden_size": 896,
            "intermediate_size": 4864,
            "num_hidden_layers": 24,
            "num_attention_heads": 14,
            "num_key_value_heads": 2,
            "vocab_size": 151936,
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        },
    ),
    "qwen2.5-1.5b": (
        "qwen2",
        {
            "hidden_size": 1536,
            "intermediate_size": 8960,
            "num_hidden_layers": 28,
            "num_attention_heads": 12,
            "num_key_value_heads": 2,
            "vocab_size": 151936,
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        },
    ),
}
HEADLINE = ("qwen2.5-1.5b", "full")  # the summary line's mfu


def load_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TOKENIZER)


def model_config(shape: str, tokenizer, layers: int | None = None):
    """The shape's transformers config (``layers``: fewer layers, for quick runs)."""
    from transformers import LlamaConfig, Qwen2Config

    kind, sizes = SHAPES[shape]
    sizes = {**sizes, "num_hidden_layers": layers or sizes["num_hidden_layers"]}
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    return (LlamaConfig if kind == "llama" else Qwen2Config)(**sizes, **ids, tie_word_embeddings=True)


def build_model(shape: str, tokenizer, device: torch.device, dtype: torch.dtype, seed: int, layers: int | None = None):
    """The shape's model, randomly initialised from ``seed`` on ``device`` (the same weights every call), in ``dtype``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(model_config(shape, tokenizer, layers), dtype=torch.float32)
    return model.to(device, dtype)


def random_prompts(tokenizer, count: int, length: int, seed: int) -> tuple[list[list[int]], list[str]]:
    """``count`` prompts of ``length`` random ids (seeded) whose text encodes back to the same ids."""
    special = set(tokenizer.all_special_ids)
    words = sorted(
        i for s, i in tokenizer.get_vocab().items() if s.startswith("Ġ") and s[1:].isascii() and s[1:].isalpha() and i not in special
    )
    rng = random.Random(seed)
    ids = [rng.choices(words, k=length) for _ in range(count)]
    texts = [tokenizer.decode(p) for p in ids]
    encoded = tokenizer(text=texts)["input_ids"]  # as TRL tokenizes a text prompt
    if [list(e) for e in encoded] != ids:
        raise RuntimeError("the prompts' text does not encode back to their ids; TRL would see other prompts")
    return ids, texts


def reward(ids: list[int]) -> float:
    return sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1)


# ---- measurement ---------------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_rate(device: torch.device, dtype: torch.dtype) -> float:
    """The device's measured matmul rate in FLOP/s: 8192^3 products in ``dtype`` on a GPU (best of 3 rounds of
    50), on the CPU core.machine.gemm_gflops (fp32, 2048^3, best of 3)."""
    if device.type != "cuda":
        return gemm_gflops(best_of=3) * 1e9
    size, repeats = 8192, 50
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(3):
        sync(device)
        started = time.perf_counter()
        for _ in range(repeats):
            a @ b
        sync(device)
        best = min(best, time.perf_counter() - started)
    del a, b
    return 2 * size**3 * repeats / best


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # Linux: writing 5 resets the process's peak RSS (VmHWM)
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def body_sizes(model) -> dict:
    """Matmul weights of the body's linear layers, the LM head's V x H, and the attention's shape."""
    cfg = model.config
    head = model.get_output_embeddings().weight
    body = sum(m.weight.numel() for m in model.model.modules() if isinstance(m, torch.nn.Linear))
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return {"N": body, "VH": head.numel(), "attn": 4 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim}


def update_flops(sizes: dict, n_lora: int, prompts: list[list[int]], responses: list[int], lora: bool) -> float:
    """The docstring's update FLOPs for one batch: each distinct prompt once, then every response."""
    distinct = {tuple(p) for p in prompts}
    plen = [len(p) for p in distinct]
    width = len(prompts[0])  # every prompt has the same length here
    t_body = sum(plen) + sum(r - 1 for r in responses)
    t_head = sum(responses)
    pairs = sum(p * (p + 1) / 2 for p in plen) + sum((r - 1) * width + (r - 1) * r / 2 for r in responses)
    attention = sizes["attn"] * pairs
    forward = 2 * sizes["N"] * t_body + 2 * sizes["VH"] * t_head + attention
    if not lora:
        return 3 * forward
    return 2 * forward + attention + 6 * n_lora * t_body + forward


# ---- the two sides -------------------------------------------------------------------------------------
def ours(args, shape: str, mode: str, tokenizer, prompt_ids: list[list[int]], device, dtype) -> dict:
    from peft import LoraConfig

    from scope_marl.training import sharding

    lora = mode == "lora"
    # Full fine-tuning in bf16 goes the way scope train takes it: float32 master weights sharded by FSDP2 (a world
    # of one), computing in bf16, gathered whole while generating.
    shard = not lora and dtype != torch.float32
    model = build_model(shape, tokenizer, device, torch.float32 if shard else dtype, args.seed, args.layers)
    sizes = body_sizes(model)
    if shard:
        sharding.open_world_of_one(torch.device(device))
        sharding.shard(model, dtype)
    chat = HFChatModel(model, tokenizer, name=shape)
    if shard:
        chat.packed = None
    chat.stop_ids = set()  # no row ends before max_new_tokens (TRL: min_new_tokens), see the docstring
    adapter = None
    if lora:
        chat.add_adapter("agent", LoraConfig(**LORA))
        adapter = "agent"
    n_lora = sum(p.numel() for n, p in chat.model.named_parameters() if "lora_" in n)
    config = LearnerConfig(lr=LR, kl_coef=BETA if lora else 0.0, eps_low=EPS_LOW, eps_high=EPS_HIGH, token_budget=args.token_budget)
    learner = Learner(chat, AGENT, adapter, 1.0, config)
    rows = [p for p in prompt_ids for _ in range(args.generations)]
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.new_tokens)
    steps = []
    reset_peak(device)
    for step in range(args.steps):
        sync(device)
        t0 = time.perf_counter()
        with sharding.gathered(chat.model):
            outs = chat.generate_ids(
                rows,
                sampling.model_copy(update={"seed": step}),
                adapters=[adapter] * len(rows),
                seeds=[step * len(rows) + i for i in range(len(rows))],
            )
        sync(device)
        t1 = time.perf_counter()
        episodes = grpo_episodes(outs, [reward(o.token_ids) for o in outs], step, args.generations, AGENT, adapter)
        metrics = learner.step(episodes)
        sync(device)
        t2 = time.perf_counter()
        responses = [len(o.token_ids) for o in outs]
        steps.append(
            {
                "generate_s": t1 - t0,
                "update_s": t2 - t1,
                "tokens": sum(responses),
                "flops": update_flops(sizes, n_lora, rows, responses, lora),
                "gap": metrics.get("logprob_gap", float("nan")),
            }
        )
    peak = peak_gib(device)
    del learner, chat
    release(device)
    timed = steps[args.warmup :]
    gen_s, upd_s = sum(s["generate_s"] for s in timed), sum(s["update_s"] for s in timed)
    return {
        "generate_s": gen_s / len(timed),
        "update_s": upd_s / len(timed),
        "tok_s": sum(s["tokens"] for s in timed) / (gen_s + upd_s),
        "tokens": sum(s["tokens"] for s in timed) / len(timed),
        "flops": sum(s["flops"] for s in timed) / len(timed),
        "gap": max(s["gap"] for s in steps),
        "update_steps": [s["update_s"] for s in steps],
        "peak_gib": peak,
    }


def trl(args, shape: str, mode: str, tokenizer, texts: list[str], device, dtype) -> dict:
    model = build_model(shape, tokenizer, device, dtype, args.seed, args.layers)
    reset_peak(device)
    result = trl_grpo(
        model,
        tokenizer,
        texts,
        lambda text, ids: reward(ids),
        steps=args.steps,
        generations=args.generations,
        new_tokens=args.new_tokens,
        lora=LORA if mode == "lora" else None,
        beta=BETA if mode == "lora" else 0.0,
        bf16=dtype == torch.bfloat16,
        use_cpu=device.type != "cuda",
        generation_kwargs={"min_new_tokens": args.new_tokens},
        on_step_end=lambda: sync(device),
    )
    result["peak_gib"] = peak_gib(device)
    del model
    release(device)
    times, tokens = result["step_times"][args.warmup :], result["step_tokens"][args.warmup :]
    result["timed_tok_s"] = sum(tokens) / sum(times) if times else float("nan")
    return result


# ---- driver --------------------------------------------------------------------------------------------
def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto (cuda when torch sees a GPU, else cpu), cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="auto: bf16 on a GPU, fp32 on the CPU")
    parser.add_argument(
        "--shapes",
        default=None,
        help=f"comma-separated, run in this order, of {', '.join(SHAPES)} (default: all on a GPU, smollm2-135m on the CPU)",
    )
    parser.add_argument("--modes", default="lora,full", help="comma-separated, run in this order: lora, full")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=None, help="prompt length (default 512 on a GPU, 128 on the CPU)")
    parser.add_argument("--new-tokens", type=int, default=None, help="new tokens per sample (default 256 on a GPU, 64 on the CPU)")
    parser.add_argument("--steps", type=int, default=None, help="steps per side (default 3 on a GPU, 1 on the CPU)")
    parser.add_argument("--warmup", type=int, default=None, help="first steps not timed (default 1 on a GPU, 0 on the CPU)")
    parser.add_argument(
        "--token-budget",
        type=int,
        default=None,
        help="our learner's micro-batch tokens (default: the whole batch on a GPU, 8192 on the CPU)",
    )
    parser.add_argument("--layers", type=int, default=None, help="every shape with this many layers instead of its own (quick runs)")
    parser.add_argument("--budget-s", type=float, default=None, help="start no new shape / mode after this many seconds (they report nan)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    want = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    args.device = torch.device(want)
    gpu = args.device.type == "cuda"
    args.dtype = {"auto": torch.bfloat16 if gpu else torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    args.shapes = (args.shapes or (",".join(SHAPES) if gpu else "smollm2-135m")).split(",")
    args.modes = args.modes.split(",")
    unknown = [s for s in args.shapes if s not in SHAPES] + [m for m in args.modes if m not in ("lora", "full")]
    if unknown:
        parser.error(f"unknown shape(s) or mode(s): {unknown}")
    args.prompt_tokens = args.prompt_tokens or (512 if gpu else 128)
    args.new_tokens = args.new_tokens or (256 if gpu else 64)
    args.steps = args.steps if args.steps is not None else (3 if gpu else 1)
    args.warmup = args.warmup if args.warmup is not None else (1 if gpu and args.steps > 1 else 0)
    if args.warmup >= args.steps:
        parser.error("--warmup must be below --steps (at least one timed step)")
    whole = args.prompts * args.prompt_tokens + args.prompts * args.generations * args.new_tokens
    args.token_budget = args.token_budget or (whole if gpu else 8192)
    return args


def report(row: dict, device: torch.device, rate: float) -> None:
    """One shape and mode: both sides' details, then its RESULT line."""
    a, b, nan = row.get("ours"), row.get("trl"), float("nan")
    shape, mode = row["shape"], row["mode"]
    if a:
        print(
            f"  ours {shape} {mode}: generate {a['generate_s']:.2f} s, update {a['update_s']:.2f} s (by step "
            + ", ".join(f"{t:.2f}" for t in a["update_steps"])
            + f"), {a['tokens']:.0f} tokens a step, update {a['flops'] / 1e12:.3f} TFLOP, logprob gap {a['gap']:.2e}, peak {a['peak_gib']:.2f} GiB"
        )
    if b:
        print(
            f"  trl  {shape} {mode}: steps "
            + ", ".join(f"{t:.2f}" for t in b["step_times"])
            + f" s (generation and update together), {b['tokens']:.0f} tokens a step, peak {b['peak_gib']:.2f} GiB"
        )
    ours_tok = a["tok_s"] if a else nan
    trl_tok = b["timed_tok_s"] if b else nan
    row["ratio"] = ours_tok / trl_tok if a and b else nan
    row["mfu"] = a["flops"] / a["update_s"] / rate if a else nan
    print(
        f"RESULT device={device.type} shape={shape} mode={mode} ours_tok_s={ours_tok:.2f} trl_tok_s={trl_tok:.2f} "
        f"ratio={row['ratio']:.3f} mfu={row['mfu']:.4f} peak_gib={a['peak_gib'] if a else nan:.2f}",
        flush=True,
    )


def main() -> int:
    args = parse_args()
    device, dtype = args.device, args.dtype
    dtype_name = str(dtype).removeprefix("torch.")
    where = f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    started = time.perf_counter()
    rate = matmul_rate(device, dtype)
    print(
        f"{where}, {dtype_name}, measured matmul {rate / 1e12:.2f} TFLOP/s ({rate / 1e9:.1f} GFLOP/s); "
        f"{args.prompts} prompts x {args.generations}, {args.prompt_tokens}-token prompts, {args.new_tokens} new tokens, "
        f"{args.steps} steps ({args.warmup} warm-up), token budget {args.token_budget}"
        + (f"; every shape cut to {args.layers} layers" if args.layers else ""),
        flush=True,
    )
    tokenizer = load_tokenizer()
    prompt_ids, texts = random_prompts(tokenizer, args.prompts, args.prompt_tokens, args.seed)
    # A kill (timeout) still prints the summary of what finished.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows, failed = [], False
    try:
        for shape in args.shapes:
            for mode in args.modes:
                row = {"shape": shape, "mode": mode}
                rows.append(row)
                if args.budget_s is not None and time.perf_counter() - started > args.budget_s:
                    print(f"  {shape} {mode}: skipped, past --budget-s {args.budget_s:g}", flush=True)
                    report(row, device, rate)
                    continue
                for side, run in (("ours", ours), ("trl", trl)):
                    begun = time.perf_counter()
                    try:
                        row[side] = run(args, shape, mode, tokenizer, prompt_ids if side == "ours" else texts, device, dtype)
                    except Exception:  # one side failing must not cost the other shapes their run
                        failed = True
                        print(f"FAILED {side} {shape} {mode}:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
                        release(device)
                    print(f"  {shape} {mode} {side}: {time.perf_counter() - begun:.1f} s", flush=True)
                report(row, device, rate)
    finally:
        ratios = [r["ratio"] for r in rows if "ratio" in r and not math.isnan(r["ratio"])]
        headline = next((r.get("mfu", math.nan) for r in rows if (r["shape"], r["mode"]) == HEADLINE), math.nan)
        print(f"RESULT ratio={min(ratios) if ratios else math.nan:.3f} mfu={headline:.4f}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
