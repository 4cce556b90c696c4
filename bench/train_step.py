"""Single-turn GRPO steps on SmolLM2-135M (fp32, CPU): ours vs TRL's GRPOTrainer configured the same way.

Both: 8 prompts x 4 completions, at most 48 new tokens, temperature 1.0, LoRA r 16 / alpha 32 on all
linear projections, lr 1e-5, beta (k3 KL to the adapter-free base) 0.01, loss "grpo"
(sequence-mean of token-means), clip 0.2 / 0.28, no reward std scaling, fp32, no gradient
checkpointing, one optimizer step per generation batch. Reward: 1 if the completion names a
dollar amount, else 0 (a persuader asking for a specific amount).

Tokens/s = generated tokens / seconds of the whole step (generation + update).
update_bound_fraction = (6 x parameters x tokens the update runs: each distinct prompt once plus every
response; policy forward and backward through the frozen base, plus the reference forward)
/ (GEMM rate x update seconds).

Requires the bench extra: pip install -e '.[bench]'   (trl, datasets)
Run: python bench/train_step.py [--steps 3]
"""

from __future__ import annotations

import argparse
import re
import resource
import time

import torch
from _trl_grpo import BETA, EPS_HIGH, EPS_LOW, LORA, LR, grpo_episodes, trl_grpo

from scope_marl.backends.embedded import converted_model_dir, load_embedded
from scope_marl.config import LearnerConfig
from scope_marl.core.machine import cpu_isa, cpu_slug, gemm_gflops
from scope_marl.core.types import Message, SamplingParams
from scope_marl.envs import AGENT
from scope_marl.envs.p4g.env import PersuasionForGood
from scope_marl.training.learner import Learner

PROMPTS, GENERATIONS, NEW_TOKENS = 8, 4, 48
AMOUNT = re.compile(r"\$\s?\d|\d+\s*(?:dollars?|cents?)", re.IGNORECASE)


def reward(text: str) -> float:
    return 1.0 if AMOUNT.search(text) else 0.0


def prompts() -> list[list[Message]]:
    env = PersuasionForGood(source="auto", word_limit=40)
    return [[Message(role="system", content=env.system_prompt(t, AGENT))] for t in env.tasks("train")[:PROMPTS]]


def ours(steps: int, chats: list[list[Message]]) -> dict:
    from peft import LoraConfig

    chat = load_embedded()
    chat.add_adapter("agent", LoraConfig(**LORA))
    learner = Learner(chat, AGENT, "agent", 1.0, LearnerConfig(lr=LR, kl_coef=BETA, eps_low=EPS_LOW, eps_high=EPS_HIGH, token_budget=8192))
    sampling = SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS)
    prompt_ids = [chat.encode_chat(c) for c in chats for _ in range(GENERATIONS)]
    gen_s = upd_s = tokens = processed = 0
    update_steps, update_system = [], []
    for step in range(steps):
        t0 = time.perf_counter()
        outs = chat.generate_ids(prompt_ids, sampling.model_copy(update={"seed": step}), adapters=["agent"] * len(prompt_ids))
        t1 = time.perf_counter()
        episodes = grpo_episodes(outs, [reward(out.text) for out in outs], step, GENERATIONS, AGENT, "agent")
        generated = sum(len(out.token_ids) for out in outs)
        tokens += generated
        processed += generated
        processed += sum(len(p) for p in {tuple(o.prompt_ids) for o in outs})  # each group's prompt runs once
        system = resource.getrusage(resource.RUSAGE_SELF).ru_stime
        learner.step(episodes)
        t2 = time.perf_counter()
        update_system.append(resource.getrusage(resource.RUSAGE_SELF).ru_stime - system)
        gen_s += t1 - t0
        upd_s += t2 - t1
        update_steps.append(t2 - t1)
    return {
        "generate_s": gen_s / steps,
        "update_s": upd_s / steps,
        "update_steps": update_steps,
        "update_system": update_system,
        "step_s": (gen_s + upd_s) / steps,
        "tok_s": tokens / (gen_s + upd_s),
        "tokens": tokens / steps,
        "processed": processed / steps,
        "params": sum(p.numel() for p in chat.model.base_model.model.parameters()),
    }


def trl(steps: int, chats: list[list[Message]]) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = converted_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    rows = [[{"role": m.role, "content": m.content} for m in c] for c in chats]
    return trl_grpo(model, tokenizer, rows, lambda text, ids: reward(text), steps=steps, generations=GENERATIONS, new_tokens=NEW_TOKENS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    chats = prompts()
    gflops = gemm_gflops()
    a = ours(args.steps, chats)
    b = trl(args.steps, chats)
    bound = 6 * a["params"] * a["processed"] / (gflops * 1e9)
    print(
        f"SmolLM2-135M fp32, {torch.get_num_threads()} threads, GEMM {gflops:.1f} GFLOP/s; {PROMPTS} prompts x {GENERATIONS}, <= {NEW_TOKENS} new tokens, LoRA r16"
    )
    print()
    print(f"{'library':<8}{'step s':>9}{'generate s':>12}{'update s':>10}{'gen tok/step':>14}{'tok/s':>9}")
    print(f"{'ours':<8}{a['step_s']:>9.1f}{a['generate_s']:>12.1f}{a['update_s']:>10.1f}{a['tokens']:>14.0f}{a['tok_s']:>9.1f}")
    print(
        f"{'trl':<8}{b['step_s']:>9.1f}{'-':>12}{'-':>10}{b['tokens']:>14.0f}{b['tok_s']:>9.1f}   (trl does not split phases; callback step {b['callback_step_s']:.1f}s)"
    )
    print()
    steady = a["update_steps"][1:]
    print(
        "ours, update seconds by step: "
        + ", ".join(f"{t:.1f}" for t in a["update_steps"])
        + (f" (without the first: bound fraction {bound / (sum(steady) / len(steady)):.3f}; RESULT counts every step)" if steady else "")
    )
    # Kernel time is mostly page faults on memory the process touches for the first time (costly on
    # some VMs), so it varies between runs; CPU seconds of all threads, not wall time.
    print("ours, kernel (system) CPU seconds by update step, all threads: " + ", ".join(f"{t:.1f}" for t in a["update_system"]))
    print()
    print(
        f"RESULT ours_tok_s={a['tok_s']:.2f} trl_tok_s={b['tok_s']:.2f} ratio={a['tok_s'] / b['tok_s']:.2f} "
        f"update_bound_fraction={bound / a['update_s']:.3f} cpu={cpu_slug()} isa={cpu_isa()}"
    )


if __name__ == "__main__":
    main()
