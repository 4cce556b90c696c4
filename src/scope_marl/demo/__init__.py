"""``scope demo``: the main job. Three parts, one report, a few minutes on a laptop CPU.

1. **The effect.** The collapse lab's ``theory`` game, every arm, 5 seeds: single-simulator RL
   collapses (reward against its training simulator up, held-out reward and policy entropy down),
   and Verbalized Sampling and co-training end above it on held-out simulators, with intervals.
2. **The same algorithms on the real LLM.** The embedded SmolLM2-135M agent trains its LoRA adapter
   with GRPO for a few steps against a frozen and a Verbalized Sampling simulator on one-exchange
   Persuasion for Good dialogues, then each agent plays a small held-out panel. This proves every
   stage on a real model with token-exact streams; a few steps of a 135M model cannot show the
   effect, and the report says so.
3. **Where to go next**: the commands for longer runs.

:func:`run_demo` puts them together. The parts live beside it: ``arms`` (part 2's arms, YAML configs
in ``configs/``, trained and evaluated through ``scope_marl.experiment``), ``scheduler`` (the two
processes that share the two cores, and the progress lines), ``report`` (report.md, report.html and
the RESULT line). Writes ``report.md``, a self-contained ``report.html``, the plots, the lab's results
under ``effect/``, one run directory per LLM arm under ``llm/``, and ``demo.json`` with every figure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from scope_marl.core import files
from scope_marl.demo.arms import ARMS, HELDOUT, HELDOUT_TASKS, arm_config, convert_model, demo_panel, needs_conversion, run_arm
from scope_marl.demo.report import closing_lines, result_line, write_demo_report
from scope_marl.demo.scheduler import (
    MAIN_LANE,
    REFERENCE_GFLOPS,
    REFERENCE_SECONDS,
    WORKER_LANE,
    Progress,
    TwoLanes,
    time_limit,
    worker_report,
)
from scope_marl.evaluation.panel import Panel

__all__ = [
    "ARMS",
    "HELDOUT",
    "HELDOUT_TASKS",
    "REFERENCE_GFLOPS",
    "REFERENCE_SECONDS",
    "Progress",
    "TwoLanes",
    "arm_config",
    "closing_lines",
    "demo_panel",
    "fresh_dir",
    "plan",
    "result_line",
    "run_demo",
    "time_limit",
]


def plan(arm: str, steps: int) -> list[tuple[str, float]]:
    """One LLM arm's stages (:func:`arms.run_arm` reports them) with their reference seconds: start, its
    steps, its held-out evaluation (which resumes the trained run first: a start's seconds more)."""
    step = (f"step:{arm}", REFERENCE_SECONDS[f"step:{arm}"])
    return [("start", REFERENCE_SECONDS["start"]), *[step] * steps, ("eval", REFERENCE_SECONDS["start"] + REFERENCE_SECONDS["eval"])]


def fresh_dir(out: Path) -> Path:
    """``out`` if it is free, else ``out-2``, ``out-3``...: a second demo never overwrites the first."""
    candidate, n = out, 1
    while candidate.exists() and any(candidate.iterdir()):
        n += 1
        candidate = out.with_name(f"{out.name}-{n}")
    return candidate


def run_demo(
    out: Path,
    steps: int = 2,
    seeds: int = 5,
    log: Callable[[str], None] = print,
    model: str = "embedded",
    panel: Panel | None = None,
    lab_settings=None,
    train_sampling: dict | None = None,
) -> dict:
    """All three parts into a fresh ``out``; returns the summary written to ``demo.json``, plus the lab's results.

    Two lanes share the two cores: this process runs the lab, then the frozen arm; a worker process
    converts the model (first run only), then trains the VS arm. ``model``, ``panel``, ``lab_settings``
    and ``train_sampling`` exist for tests (a tiny model, a shorter lab). The worker is a spawned
    process, so a script that calls this needs the usual ``if __name__ == "__main__":`` guard."""
    from scope_marl.core.machine import gemm_gflops
    from scope_marl.lab.run import run_lab

    started = time.perf_counter()
    gflops = gemm_gflops(repeats=1, best_of=10)
    out = fresh_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    panel = demo_panel(panel)
    convert = needs_conversion(model)
    main_arm, worker_arm = ARMS
    progress = Progress(
        {
            MAIN_LANE: [("effect", REFERENCE_SECONDS["effect"]), *plan(main_arm, steps), ("report", REFERENCE_SECONDS["report"])],
            WORKER_LANE: [("convert", REFERENCE_SECONDS["convert"])] * convert + plan(worker_arm, steps),
        },
        gflops,
        log,
    )
    log(
        f"scope demo -> {out}  (torch GEMM {gflops:.0f} GFLOP/s; the target on this machine is {time_limit(gflops):.0f} s; "
        f"~{progress.remaining():.0f} s estimated)"
    )
    log(
        f"two processes: the collapse lab, then the {main_arm} arm | "
        + ("the model conversion (first run only), then " if convert else "")
        + f"the {worker_arm} arm"
    )
    with TwoLanes(progress) as lanes:
        conversion = lanes.submit(convert_model, worker_report) if convert else None
        worker = lanes.submit(run_arm, worker_arm, steps, model, panel, out / "llm", worker_report, train_sampling)
        lab = run_lab("theory", seeds=seeds, out=out / "effect", log=lambda _: None, settings=lab_settings)
        lanes.report(("effect", f"[1/3 effect] collapse lab: {len(lab['arms'])} arms x {seeds} seeds in {lab['seconds']:.0f} s"))
        if conversion is not None:
            conversion.result()  # the main lane's arm needs the converted model too
        arms = {main_arm: run_arm(main_arm, steps, model, panel, out / "llm", lanes.report, train_sampling)}
        arms[worker_arm] = worker.result()  # raises the worker's error, if any
    llm = {"steps": steps, "panel": [s.id for s in panel.simulators], "arms": {arm: arms[arm] for arm in ARMS}}
    result = {
        "seconds": None,
        "gemm_gflops": gflops,
        "time_limit_s": time_limit(gflops),
        "single_heldout_change": lab["results"]["single"]["change"]["heldout_reward"]["mean"],
        "vs_prob_over_single_low": lab["results"]["vs_prob"]["heldout_vs_single"]["low"],
        "cotrain_over_single_low": lab["results"]["cotrain"]["heldout_vs_single"]["low"],
    }
    summary = {"out": str(out), "result": result, "lab_seconds": lab["seconds"], "llm": llm}
    write_demo_report(out, lab, llm, summary)
    progress.done(MAIN_LANE, "report", f"[3/3 report] {out / 'report.md'} and {out / 'report.html'}")
    result["seconds"] = time.perf_counter() - started
    files.write_json(out / "demo.json", summary)
    return {**summary, "lab": lab}
