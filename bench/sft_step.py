"""SFT steps on SmolLM2-135M (fp32, CPU): ours (the project's learner, as scope sft runs it) vs TRL's
SFTTrainer configured the same way, on the same human persuadee turns of the P4G corpus.

Both: LoRA r 16 / alpha 32 on every projection, AdamW lr 2e-4, batch 8 turns, loss on the completion
(the human's turn) only, no gradient checkpointing, the same turns in the same order. TRL gets them
as a prompt-completion dataset (the chat so far as the prompt, the human's message as the
completion), so its chat template renders the same text. One warm-up step each, then ``--steps``
timed steps. The first step's losses (before any update: both score the base model on the same
turns) are printed side by side; they are not the same number, because TRL's completion also counts
the newline its template writes after the end-of-turn token (a near-certain token that lowers the mean).

Ends with exactly one line:

    RESULT ours_step_s=A trl_step_s=B ratio=R ours_loss=L1 trl_loss=L2 target_tokens=N gemm_gflops=G

``ratio`` = TRL's seconds per step / ours (above 1: ours is faster). Needs the P4G corpus and the
bench extra (pip install -e '.[bench]': trl, datasets). Usage: python bench/sft_step.py [--steps 4]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from scope_marl.backends.embedded import converted_model_dir
from scope_marl.config import P4GConfig, SFTConfig
from scope_marl.core.machine import gemm_gflops
from scope_marl.training.sft import start_sft

BATCH = 8
LORA = {
    "r": 16,
    "lora_alpha": 32,
    "lora_dropout": 0.0,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}


def ours(steps: int, out: str) -> tuple[dict, list]:
    cfg = SFTConfig(
        env=P4GConfig(name="p4g", source="corpus", max_exchanges=3, word_limit=30),
        max_train_turns=BATCH * (steps + 1),
        max_val_turns=1,
        batch_size=BATCH,
        eval_every=0,
        checkpoint_every=1000,
        lr=2e-4,
    )
    run = start_sft(cfg, out)
    turns = [run.train_turns[i] for k in range(steps + 1) for i in run.batch_indices(k)]
    first = run.learner.supervised_step(run.batch(0))  # warm-up (and the base model's loss)
    started = time.perf_counter()
    for k in range(1, steps + 1):
        run.learner.supervised_step(run.batch(k))
    seconds = (time.perf_counter() - started) / steps
    tokens = sum(s.num_sampled_tokens for k in range(1, steps + 1) for s in run.batch(k)) / steps
    run.close()
    return {"step_s": seconds, "loss": first["loss"], "tokens": tokens}, turns


def trl(steps: int, turns: list) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig as TRLConfig
    from trl import SFTTrainer

    path = converted_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    data = Dataset.from_dict(
        {
            "prompt": [[{"role": m.role, "content": m.content} for m in t.context] for t in turns],
            "completion": [[{"role": "assistant", "content": t.target}] for t in turns],
        }
    )

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.begins, self.ends, self.losses = [], [], []

        def on_step_begin(self, args, state, control, **kw):
            self.begins.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            self.ends.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                self.losses.append(logs["loss"])

    timer = StepTimer()
    with tempfile.TemporaryDirectory() as out:
        config = TRLConfig(
            output_dir=out,
            per_device_train_batch_size=BATCH,
            learning_rate=2e-4,
            lr_scheduler_type="constant",
            warmup_steps=0,
            max_grad_norm=1.0,
            weight_decay=0.0,
            completion_only_loss=True,
            max_length=None,
            packing=False,
            bf16=False,
            fp16=False,
            use_cpu=True,
            gradient_checkpointing=False,
            max_steps=steps + 1,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            shuffle_dataset=False,
            seed=0,
        )
        trainer = SFTTrainer(
            model=model, args=config, train_dataset=data, processing_class=tokenizer, peft_config=LoraConfig(**LORA), callbacks=[timer]
        )
        # In dataset order, as ours: the first batch is the same turns, so the first losses compare.
        trainer._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(trainer.train_dataset)
        trainer.train()
    timed = [b - a for a, b in zip(timer.begins[1:], timer.ends[1:])]
    return {"step_s": sum(timed) / len(timed), "loss": timer.losses[0] if timer.losses else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gflops = gemm_gflops()
    print(f"GEMM {gflops:.0f} GFLOP/s on {args.threads} threads", flush=True)
    with tempfile.TemporaryDirectory() as out:
        a, turns = ours(args.steps, f"{out}/run")
    print(f"ours: {a['step_s']:.1f} s/step, first loss {a['loss']:.4f}, {a['tokens']:.0f} target tokens/step", flush=True)
    b = trl(args.steps, turns)
    print(f"trl:  {b['step_s']:.1f} s/step, first loss {b['loss']:.4f}", flush=True)
    print(
        f"RESULT ours_step_s={a['step_s']:.2f} trl_step_s={b['step_s']:.2f} ratio={b['step_s'] / a['step_s']:.2f} "
        f"ours_loss={a['loss']:.4f} trl_loss={b['loss']:.4f} target_tokens={a['tokens']:.0f} gemm_gflops={gflops:.0f}"
    )


if __name__ == "__main__":
    main()
