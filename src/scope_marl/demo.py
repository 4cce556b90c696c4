"""``scope demo``: every stage on the real embedded model, small enough for a laptop CPU.

Three arms (single frozen simulator, Verbalized Sampling, population co-training) each train the
agent's LoRA adapter for a few GRPO steps on short Persuasion for Good dialogues, then play a small
panel of held-out simulators on test tasks. It is a smoke run of the whole pipeline, not a
demonstration of the effect: a few steps of a 135M model do not move rewards reliably (the
collapse lab is where the effect shows). Writes ``results.json``, ``report.md`` and ``rewards.png``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from scope_marl.config import FrozenSimulatorConfig, PersonaGuidedConfig, TrainConfig
from scope_marl.backends.base import SamplingParams

TRAIN_SAMPLING = {"temperature": 0.7, "top_p": 0.95, "max_new_tokens": 32}
ARMS = {
    "frozen": {"simulator": {"mode": "frozen", "model": "embedded", "sampling": TRAIN_SAMPLING}},
    "vs_prob": {"simulator": {"mode": "vs", "model": "embedded", "k": 3, "method": "prob", "sampling": {**TRAIN_SAMPLING, "max_new_tokens": 24}}},
    "population": {
        "simulator": {"mode": "trainable", "model": "embedded", "sampling": TRAIN_SAMPLING},
        "trainable_roles": ["agent", "user"],
        "pool": {"every": 1, "max_size": 3},
    },
}
PANEL = [
    FrozenSimulatorConfig(id="heldout-skeptic", prompt_prefix="You are skeptical and careful with money.",
                          sampling=SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=32)),
    PersonaGuidedConfig(mode="persona_guided", id="heldout-persona-guided", sampling=SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=32)),
]


def arm_config(arm: str, steps: int) -> TrainConfig:
    return TrainConfig.model_validate({
        "model": "embedded",
        "env": {"name": "p4g", "max_exchanges": 2, "word_limit": 30},
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
    })


def fresh_dir(out: Path) -> Path:
    """``out`` if it is free, else ``out-2``, ``out-3``...: a second demo never overwrites the first."""
    candidate, n = out, 1
    while candidate.exists() and any(candidate.iterdir()):
        n += 1
        candidate = out.with_name(f"{out.name}-{n}")
    return candidate


def run_demo(out: Path, steps: int = 3, arms: list[str] | None = None, log=print) -> Path:
    from scope_marl.rollout.factory import ModelPool, build_simulator
    from scope_marl.training.trainer import start

    out = fresh_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    log(f"writing the demo to {out}")
    results = {}
    for arm in arms or list(ARMS):
        started = time.perf_counter()
        log(f"[{arm}] training {steps} steps")
        trainer = start(arm_config(arm, steps), out / arm)
        records = trainer.run()
        models = ModelPool()
        models.register("embedded", trainer.chat)  # the panel plays on the same loaded model
        heldout = {}
        for sim_cfg in PANEL:
            log(f"[{arm}] evaluating against {sim_cfg.id}")
            heldout[sim_cfg.id] = trainer.evaluate(build_simulator(sim_cfg, models))
        results[arm] = {
            "train_reward": [r.get("reward_agent", {}).get("mean") for r in records],
            "train_entropy": [r["train_agent"].get("entropy") for r in records],
            "heldout": heldout,
            "seconds": time.perf_counter() - started,
        }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    write_report(out, results)
    return out / "report.md"


def write_report(out: Path, results: dict) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panel = [s.id for s in PANEL]
    lines = ["# scope demo", "", "Agent reward = donation / $2. Train reward per step against the arm's own simulator;",
             "held-out reward and the agent's mean token entropy on test tasks after training.", "",
             "| arm | train reward by step | " + " | ".join(f"held-out: {p}" for p in panel) + " | policy entropy | seconds |",
             "|---|---|" + "---|" * len(panel) + "---|---|"]
    for arm, r in results.items():
        train = ", ".join("-" if x is None else f"{x:.3f}" for x in r["train_reward"])
        held = " | ".join(f"{r['heldout'][p]['reward_agent']:.3f}" if r["heldout"][p]["reward_agent"] is not None else "-" for p in panel)
        entropy = [r["heldout"][p]["policy_entropy"] for p in panel if r["heldout"][p]["policy_entropy"] is not None]
        lines.append(f"| {arm} | {train} | {held} | {sum(entropy) / len(entropy):.3f} | {r['seconds']:.0f} |" if entropy else f"| {arm} | {train} | {held} | - | {r['seconds']:.0f} |")
    (out / "report.md").write_text("\n".join(lines) + "\n")

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for arm, r in results.items():
        left.plot(range(1, len(r["train_reward"]) + 1), [x if x is not None else float("nan") for x in r["train_reward"]], marker="o", label=arm)
    left.set(title="Agent reward vs its training simulator", xlabel="training step", ylabel="mean agent reward (donation / $2)")
    left.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    left.legend()
    width = 0.8 / max(len(results), 1)
    for i, (arm, r) in enumerate(results.items()):
        values = [r["heldout"][p]["reward_agent"] or 0.0 for p in panel]
        right.bar([j + i * width for j in range(len(panel))], values, width, label=arm)
    right.set_xticks([j + width * (len(results) - 1) / 2 for j in range(len(panel))], panel)
    right.set(title="Agent reward vs held-out simulators (test tasks)", ylabel="mean agent reward")
    right.legend()
    fig.tight_layout()
    fig.savefig(out / "rewards.png", dpi=100)
    plt.close(fig)
