"""``scope demo``: every stage on the real embedded model, small enough for a laptop CPU.

Three arms (single frozen simulator, Verbalized Sampling, population co-training) each train the
agent's LoRA adapter for a few GRPO steps on short Persuasion for Good dialogues, then play the
built-in ``offline`` panel of held-out simulators on test tasks (``scope eval``'s code), and
``scope report``'s code writes the report. It is a smoke run of the whole pipeline, not a
demonstration of the effect: a few steps of a 135M model do not move rewards reliably (the
collapse lab is where the effect shows). Writes one run directory per arm, ``report.md``,
``collapse.png`` and ``heldout.png``.
"""

from __future__ import annotations

import time
from pathlib import Path

from scope_marl.config import TrainConfig
from scope_marl.evaluation.panel import Panel, load_panel

TRAIN_SAMPLING = {"temperature": 0.7, "top_p": 0.95, "max_new_tokens": 32}
ARMS = {
    "frozen": {"simulator": {"mode": "frozen", "id": "train-frozen", "sampling": TRAIN_SAMPLING}},
    "vs_prob": {
        "simulator": {"mode": "vs", "id": "train-vs", "k": 3, "method": "prob", "sampling": {**TRAIN_SAMPLING, "max_new_tokens": 24}}
    },
    "population": {
        "simulator": {"mode": "trainable", "id": "train-population", "sampling": TRAIN_SAMPLING},
        "trainable_roles": ["agent", "user"],
        "pool": {"every": 1, "max_size": 3},
    },
}
ENV = {"name": "p4g", "max_exchanges": 2, "word_limit": 30}


def arm_config(arm: str, steps: int, model: str = "embedded") -> TrainConfig:
    simulator = {**ARMS[arm]["simulator"], "model": model}
    return TrainConfig.model_validate(
        {
            "model": model,
            "env": ENV,
            "agent_sampling": TRAIN_SAMPLING,
            "lora": {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]},
            "learner": {"lr": 1e-4, "kl_coef": 0.01},
            "rollout": {"group_size": 2, "max_concurrent": 16, "on_turn_limit": "continue", "progress": False},
            "tasks_per_step": 2,
            "steps": steps,
            "eval": {"every": 0, "tasks": 2},
            "checkpoint_every": steps,
            "seed": 0,
            **ARMS[arm],
            "simulator": simulator,
        }
    )


def demo_panel(panel: Panel | None = None) -> Panel:
    """The offline panel, cut to 2 test tasks x 1 sample per simulator on the demo's short dialogues."""
    panel = panel or load_panel("offline")
    return panel.model_copy(update={"env": arm_config("frozen", 1).env, "tasks_per_simulator": 2, "samples_per_task": 1})


def fresh_dir(out: Path) -> Path:
    """``out`` if it is free, else ``out-2``, ``out-3``...: a second demo never overwrites the first."""
    candidate, n = out, 1
    while candidate.exists() and any(candidate.iterdir()):
        n += 1
        candidate = out.with_name(f"{out.name}-{n}")
    return candidate


def run_demo(
    out: Path, steps: int = 3, arms: list[str] | None = None, log=print, model: str = "embedded", panel: Panel | None = None
) -> Path:
    from scope_marl.evaluation.evaluate import write_results
    from scope_marl.evaluation.report import write_report
    from scope_marl.experiment import evaluate_trainer, start

    out = fresh_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    log(f"writing the demo to {out}")
    panel = demo_panel(panel)
    arms = arms or list(ARMS)
    for arm in arms:
        started = time.perf_counter()
        log(f"[{arm}] training {steps} steps")
        trainer = start(arm_config(arm, steps, model), out / arm)
        trainer.run()
        log(f"[{arm}] evaluating on the {panel.name} panel ({len(panel.simulators)} held-out simulators)")
        write_results(evaluate_trainer(trainer, panel, log=lambda m, arm=arm: log(f"[{arm}] {m}")), out / arm / "eval")
        log(f"[{arm}] done in {time.perf_counter() - started:.0f}s")
    return write_report([out / arm for arm in arms], out, title="scope demo: agent trained a few steps per arm")
