"""Part 2, the LLM arms: their configs, the held-out panel they play, the model they need, one arm's run.

Each arm is a whole ``scope train`` config in ``configs/`` beside this module (shipped with the
package, so an installed ``scope demo`` finds it). :func:`arm_config` reads one and applies the
demo's overrides: the number of steps, the model and, for tests, the sampling. An arm trains and is
evaluated through ``scope_marl.experiment``, as any run is.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from pathlib import Path

from scope_marl.config import TrainConfig, validate
from scope_marl.config.loading import read_yaml
from scope_marl.evaluation.panel import Panel, load_panel

CONFIGS = Path(__file__).parent / "configs"
ARMS = ("frozen", "vs_prob")  # the main lane's arm, then the worker lane's (the heavier VS arm, beside the model conversion)
HELDOUT = ("skeptic", "generous")  # two of the built-in offline panel's held-out simulators
HELDOUT_TASKS = 4

Report = Callable[..., None]  # report((stage, message), ...): these stages of the lane are done


def arm_document(arm: str) -> dict:
    """The YAML document of one of the demo's arms (:data:`ARMS`), as written."""
    return read_yaml(CONFIGS / f"{arm}.yaml")


def arm_config(arm: str, steps: int, model: str = "embedded", sampling: dict | None = None, **overrides) -> TrainConfig:
    """The config of one LLM arm of the demo: its YAML with ``steps`` (and a checkpoint at the last
    step) and ``model`` (the agent's and the simulator's). ``sampling`` updates the agent's and the
    simulator's sampling (tests: a random model needs plain sampling); ``overrides`` replace top-level
    fields (scripts/example_report.py's longer runs, where an arm not in :data:`ARMS` gets the demo's
    settings and names its own ``simulator``)."""
    document = arm_document(arm) if arm in ARMS else {**arm_document(ARMS[0]), "simulator": {}}
    simulator = {**document["simulator"], "model": model}
    if sampling is not None and "sampling" in simulator:
        simulator["sampling"] = {**simulator["sampling"], **sampling}
    demo = {
        "model": model,
        "agent_sampling": {**document["agent_sampling"], **(sampling or {})},
        "simulator": simulator,
        "steps": steps,
        "checkpoint_every": steps,
    }
    return validate({**document, **demo, **overrides}, TrainConfig, f"the demo's {arm} arm")


def demo_panel(panel: Panel | None = None) -> Panel:
    """The held-out panel of part 2: two simulators of the offline panel (or ``panel``'s) on the arms'
    dialogues, agent sampling and turn length."""
    if panel is None:
        offline = load_panel("offline")
        panel = offline.model_copy(update={"name": "demo-heldout", "simulators": [s for s in offline.simulators if s.id in HELDOUT]})
    arm = arm_document(ARMS[0])
    spec = panel.model_dump()
    for entry in spec["simulators"]:  # the demo's short turns for every simulator too
        if "sampling" in entry["simulator"]:
            entry["simulator"]["sampling"]["max_new_tokens"] = arm["agent_sampling"]["max_new_tokens"]
    return Panel.model_validate(
        {
            **spec,
            "env": arm["env"],
            "agent_sampling": arm["agent_sampling"],
            "tasks_per_simulator": HELDOUT_TASKS,
            "samples_per_task": 1,
        }
    )


def needs_conversion(model: str) -> bool:
    """Whether the embedded model still has to be converted (a missing wheel fails here, with the install command)."""
    if model != "embedded":
        return False
    from scope_marl.backends.embedded import is_converted, locate_gguf

    if is_converted():
        return False
    locate_gguf()
    return True


def convert_model(report: Report) -> str:
    """Convert the embedded model into the cache; its folder."""
    from scope_marl.backends.embedded import converted_model_dir

    with contextlib.redirect_stderr(io.StringIO()):  # transformers' progress bars would cut into the demo's lines
        path = str(converted_model_dir())
    report(("convert", "[2/3 llm] embedded model converted into the cache"))
    return path


def run_arm(arm: str, steps: int, model: str, panel: Panel, out: Path, report: Report, sampling: dict | None = None) -> dict:
    """Train one arm ``steps`` GRPO steps into ``out/arm`` (``experiment.start`` and the trainer's own
    loop), then play the held-out panel with the trained agent; its step records and held-out
    evaluation. ``report`` gets the stages of :func:`scope_marl.demo.plan` as each is done."""
    import torch

    from scope_marl.evaluation.evaluate import write_results
    from scope_marl.experiment import evaluate_trainer, start

    run_dir = out / arm
    # The demo's scheduler gives each lane its threads: the run keeps them (no thread governor) so the
    # lanes' plan and the time-left estimate hold.
    trainer = start(arm_config(arm, steps, model, sampling, threads=torch.get_num_threads()), run_dir)
    report(("start", f"[2/3 llm] {arm}: model, simulator and LoRA adapter set up"))

    def step_done(record: dict) -> None:
        t = record["train_agent"]
        reward = record.get("reward_agent", {}).get("mean", float("nan"))
        line = f"step {record['step']}/{steps}: reward {reward:.2f}, ratio {t.get('ratio_mean', float('nan')):.4f}"
        report((f"step:{arm}", f"[2/3 llm] {arm} {line}, log-prob gap {t.get('logprob_gap', float('nan')):.1e}"))

    records = trainer.run(progress=False, on_step=step_done)  # (releases the run directory at the end)
    evaluation = evaluate_trainer(trainer, panel, log=lambda _: None)
    write_results(evaluation, run_dir / "eval")
    held = evaluation["heldout"]["reward"]
    report(("eval", f"[2/3 llm] {arm} on {len(panel.simulators)} held-out simulators: reward {held['mean']:.2f}"))
    return {"records": records, "heldout": evaluation["heldout"]}
