"""What the GRPO benches share: the settings both sides run with, our rollouts as Episodes, and TRL's
GRPOTrainer run on the same model and prompts (bench/train_step.py, bench/gpu_train_step.py).

TRL needs the bench extra: pip install -e '.[bench]'   (trl, datasets)
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence

from scope_marl.core.types import Episode, RoleStream

# LoRA r 16 / alpha 32 on all linear projections, lr 1e-5, beta (k3 KL to the adapter-free base) 0.01,
# clip 0.2 / 0.28: both sides of every GRPO bench.
LORA = {
    "r": 16,
    "lora_alpha": 32,
    "lora_dropout": 0.0,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}
LR, BETA, EPS_LOW, EPS_HIGH = 1e-5, 0.01, 0.2, 0.28


def grpo_episodes(outs: Sequence, rewards: Sequence[float], step: int, generations: int, role: str, adapter: str | None) -> list[Episode]:
    """Single-turn episodes of one rollout batch (``generations`` consecutive generations per prompt make a group),
    every generated token trained on."""
    episodes = []
    for i, (out, r) in enumerate(zip(outs, rewards)):
        stream = RoleStream(
            role=role,
            prompt_ids=out.prompt_ids,
            response_ids=out.token_ids,
            loss_mask=[1] * len(out.token_ids),
            logprobs=out.logprobs,
            entropies=out.entropies,
            adapter=adapter,
            reward=r,
        )
        episodes.append(
            Episode(
                episode_id=f"{step}-{i}",
                task_id=str(i // generations),
                group_id=f"{step}-{i // generations}",
                simulator_id="none",
                streams={role: stream},
                rewards={role: r},
            )
        )
    return episodes


def trl_grpo(
    model,
    tokenizer,
    prompts: list,
    reward: Callable[[str, list[int]], float],
    *,
    steps: int,
    generations: int,
    new_tokens: int,
    lora: dict | None = LORA,
    beta: float = BETA,
    temperature: float = 1.0,
    bf16: bool = False,
    use_cpu: bool = True,
    generation_kwargs: dict | None = None,
    on_step_end: Callable[[], None] | None = None,
) -> dict:
    """``steps`` steps of TRL's GRPOTrainer on ``model``, each one batch of every prompt x ``generations``
    (one generation batch, one optimizer step, no gradient checkpointing, loss "grpo", no reward std scaling).

    ``prompts``: chats (lists of {"role", "content"}) or plain text, as TRL's dataset takes them; ``reward(text,
    completion_ids)`` scores one completion; ``lora=None`` fine-tunes every weight. ``on_step_end`` is called
    inside each step's timing, last (e.g. a CUDA synchronize). Returns seconds per step over the whole train()
    call (``step_s``), each step's seconds as TRL's callbacks bracket it (generation and update: ``step_times``),
    the tokens TRL generated per step (``step_tokens``: completion ids as generated, the end-of-turn token
    included, as ours counts) and over the whole call (``tok_s``).
    """
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    data = Dataset.from_dict({"prompt": list(prompts) * steps})
    generated: list[int] = []  # completion lengths, in the order TRL scored them

    def reward_fn(completions, completion_ids, **kwargs):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        generated.extend(len(ids) for ids in completion_ids)
        return [reward(t, list(ids)) for t, ids in zip(texts, completion_ids)]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.marks = []

        def on_step_begin(self, args, state, control, **kw):
            self.marks.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            if on_step_end is not None:
                on_step_end()
            self.marks.append(time.perf_counter())

    # No activation checkpointing (TRL's default turns it on): transformers >= 5.x names it activation_checkpointing,
    # with gradient_checkpointing a deprecated alias.
    fields = GRPOConfig.__dataclass_fields__
    no_checkpointing = {"activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing": False}
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=len(prompts) * generations,
            num_generations=generations,
            max_completion_length=new_tokens,
            temperature=temperature,
            learning_rate=LR,
            beta=beta,
            loss_type="grpo",
            epsilon=EPS_LOW,
            epsilon_high=EPS_HIGH,
            scale_rewards="none",
            bf16=bf16,
            fp16=False,
            use_cpu=use_cpu,
            max_steps=steps,
            logging_steps=1,
            report_to="none",
            disable_tqdm=True,
            save_strategy="no",
            num_iterations=1,
            seed=0,
            generation_kwargs=generation_kwargs,
            **no_checkpointing,
        )
        timer = StepTimer()
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[reward_fn],
            args=config,
            train_dataset=data,
            processing_class=tokenizer,
            peft_config=LoraConfig(**lora) if lora is not None else None,
            callbacks=[timer],
        )
        started = time.perf_counter()
        trainer.train()
        total = time.perf_counter() - started
        del trainer
    step_times = [b - a for a, b in zip(timer.marks[::2], timer.marks[1::2])]
    per_step = len(prompts) * generations
    return {
        "step_s": total / steps,
        "step_times": step_times,
        "callback_step_s": sum(step_times) / max(len(step_times), 1),
        "step_tokens": [sum(generated[k * per_step : (k + 1) * per_step]) for k in range(steps)],
        "tok_s": sum(generated) / total,
        "tokens": sum(generated) / steps,
    }
