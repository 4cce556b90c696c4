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

Two processes share the two cores: this one runs the lab, then the frozen arm; a second one converts
the model (first run only), then trains the VS arm. :class:`Progress` prints a line per stage with the
elapsed time and an estimate of what remains, from each stage's cost on a reference machine scaled by
this machine's GEMM speed.
Writes ``report.md``, a self-contained ``report.html``, the plots, the lab's results under
``effect/``, one run directory per LLM arm under ``llm/``, and ``demo.json`` with every figure.
"""

from __future__ import annotations

import contextlib
import functools
import io
import multiprocessing
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from scope_marl.config import TrainConfig
from scope_marl.core import files
from scope_marl.evaluation.panel import Panel, load_panel
from scope_marl.evaluation.stats import format_interval

# ---- part 2: the LLM arms ------------------------------------------------------------------------
# One exchange (the agent's appeal, the persuadee's answer) of short turns: on a CPU a decode step
# costs about the same for 1 or 16 rows (the weights are read once per step), so time goes with the
# number of turns and tokens per turn, not with the number of episodes.
ENV = {"name": "p4g", "max_exchanges": 1, "word_limit": 20}
TRAIN_SAMPLING = {"temperature": 0.7, "top_p": 0.95, "max_new_tokens": 16}
ARMS = {
    "frozen": {"mode": "frozen", "id": "train-frozen", "sampling": TRAIN_SAMPLING},
    "vs_prob": {"mode": "vs", "id": "train-vs", "k": 3, "method": "prob", "sampling": {**TRAIN_SAMPLING, "max_new_tokens": 10}},
}
HELDOUT = ("skeptic", "generous")  # two of the built-in offline panel's held-out simulators
HELDOUT_TASKS = 4

# ---- time estimates ------------------------------------------------------------------------------
# Seconds each stage took on the reference machine (2 cores, torch fp32 GEMM at REFERENCE_GFLOPS),
# measured with `scope demo` from an empty $SCOPE_CACHE. A stage's estimate here is its reference time
# scaled by REFERENCE_GFLOPS / this machine's GEMM, then by how the stages so far compared with theirs.
REFERENCE_GFLOPS = 134.0
REFERENCE_SECONDS = {"effect": 27.0, "convert": 23.0, "start": 2.0, "step:frozen": 18.0, "step:vs_prob": 23.0, "eval": 23.0, "report": 3.0}
TIME_LIMIT_AT_70 = 300.0  # the promise: 5 minutes on a 70 GFLOP/s machine, i.e. 300 x 70 / G seconds here


def time_limit(gflops: float) -> float:
    """The most seconds the demo may take on a machine whose GEMM runs at ``gflops``."""
    return TIME_LIMIT_AT_70 * 70.0 / gflops


class Progress:
    """Elapsed time and what remains, as lines: ``[2/3 llm] frozen step 1/2 ... | 52 s elapsed, ~80 s left``.

    Stages run in lanes (the demo's two processes); each lane lists its stages with their reference
    seconds. What remains is the longest lane's pending reference time, scaled to this machine's GEMM
    speed and by the ratio of actual to estimated time over the stages done so far (so a machine slower
    than its GEMM suggests is caught early). Thread-safe: the other process's events arrive on a thread.
    """

    def __init__(
        self,
        lanes: dict[str, list[tuple[str, float]]],
        gflops: float,
        log: Callable[[str], None],
        clock=time.perf_counter,
        prior: float = 20.0,
    ):
        self.prior = prior  # estimated seconds the correction starts from, so one odd first stage cannot swing it
        self.pending = {lane: list(stages) for lane, stages in lanes.items()}
        self.scale = REFERENCE_GFLOPS / gflops
        self.log, self.clock = log, clock
        self.started = clock()
        self.last = dict.fromkeys(lanes, self.started)
        self.actual = self.estimated = 0.0
        self.lock = threading.Lock()

    def remaining(self) -> float:
        correction = (self.actual + self.prior) / (self.estimated + self.prior) if self.estimated + self.prior else 1.0
        return correction * self.scale * max((sum(s for _, s in stages) for stages in self.pending.values()), default=0.0)

    def elapsed(self) -> float:
        return self.clock() - self.started

    def done(self, lane: str, stage: str, message: str) -> None:
        """Mark the first pending ``stage`` of ``lane`` finished and print ``message`` with the times."""
        with self.lock:
            now = self.clock()
            stages = self.pending[lane]
            _, reference = stages.pop(next(i for i, (name, _) in enumerate(stages) if name == stage))
            self.actual += now - self.last[lane]
            self.estimated += reference * self.scale
            self.last[lane] = now
            self.log(f"{message} | {self.elapsed():.0f} s elapsed, ~{self.remaining():.0f} s left")


def plan(arm: str, steps: int) -> list[tuple[str, float]]:
    """One LLM arm's stages: start, its steps, its held-out evaluation."""
    step = (f"step:{arm}", REFERENCE_SECONDS[f"step:{arm}"])
    return [("start", REFERENCE_SECONDS["start"]), *[step] * steps, ("eval", REFERENCE_SECONDS["eval"])]


# ---- the second process --------------------------------------------------------------------------
# Two lanes share the two cores: this process runs the lab, then the frozen arm; a second process
# converts the embedded model (first run only), then trains the VS arm. Both run torch on one thread:
# decoding is bound by memory bandwidth (one thread decodes as fast as two), so two arms side by side
# take little longer than one.
WORKER_LANE, MAIN_LANE = "worker", "main"
_events = None  # in the second process: the queue its progress events go to


def _worker_init(events) -> None:
    global _events
    import torch

    torch.set_num_threads(1)
    _events = events


def _worker_convert() -> str:
    from scope_marl.backends.embedded import converted_model_dir

    with contextlib.redirect_stderr(io.StringIO()):  # transformers' progress bars would cut into the demo's lines
        path = str(converted_model_dir())
    _events.put((WORKER_LANE, "convert", "[2/3 llm] embedded model converted into the cache"))
    return path


def _worker_arm(arm: str, steps: int, model: str, panel: Panel, out: Path, sampling: dict | None) -> dict:
    report = lambda stage, message: _events.put((WORKER_LANE, stage, message))
    return train_and_evaluate(arm, steps, model, panel, out, report, sampling)


def needs_conversion(model: str) -> bool:
    """Whether the embedded model still has to be converted (a missing wheel fails here, with the install command)."""
    if model != "embedded":
        return False
    from scope_marl.backends.embedded import is_converted, locate_gguf

    if is_converted():
        return False
    locate_gguf()
    return True


# ---- configs -------------------------------------------------------------------------------------


def arm_config(arm: str, steps: int, model: str = "embedded", sampling: dict | None = None, **overrides) -> TrainConfig:
    """The config of one LLM arm of the demo; ``overrides`` replace top-level fields (longer runs in
    scripts/example_report.py; an arm not in :data:`ARMS` names its own ``simulator``). ``sampling``
    replaces the agent's and the simulator's sampling (tests: a random model needs plain sampling)."""
    simulator = {**ARMS.get(arm, {}), "model": model}
    if sampling is not None and "sampling" in simulator:
        simulator["sampling"] = {**simulator["sampling"], **sampling}
    return TrainConfig.model_validate(
        {
            "model": model,
            "env": ENV,
            "agent_sampling": {**TRAIN_SAMPLING, **(sampling or {})},
            "simulator": simulator,
            "lora": {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]},
            "learner": {"lr": 1e-4, "kl_coef": 0.01, "token_budget": 512},  # two streams per micro-batch: less memory, two processes
            "rollout": {"group_size": 2, "max_concurrent": 16, "on_turn_limit": "continue", "progress": False},
            "tasks_per_step": 2,
            "steps": steps,
            "eval": {"every": 0},
            "checkpoint_every": steps,
            "seed": 0,
            **overrides,
        }
    )


def demo_panel(panel: Panel | None = None) -> Panel:
    """The held-out panel of part 2: two simulators of the offline panel on the demo's dialogues and turn length."""
    if panel is None:
        offline = load_panel("offline")
        panel = offline.model_copy(update={"name": "demo-heldout", "simulators": [s for s in offline.simulators if s.id in HELDOUT]})
    spec = panel.model_dump()
    for entry in spec["simulators"]:  # the demo's short turns for every simulator too
        if "sampling" in entry["simulator"]:
            entry["simulator"]["sampling"]["max_new_tokens"] = TRAIN_SAMPLING["max_new_tokens"]
    return Panel.model_validate(
        {
            **spec,
            "env": ENV,
            "agent_sampling": TRAIN_SAMPLING,
            "tasks_per_simulator": HELDOUT_TASKS,
            "samples_per_task": 1,
        }
    )


def fresh_dir(out: Path) -> Path:
    """``out`` if it is free, else ``out-2``, ``out-3``...: a second demo never overwrites the first."""
    candidate, n = out, 1
    while candidate.exists() and any(candidate.iterdir()):
        n += 1
        candidate = out.with_name(f"{out.name}-{n}")
    return candidate


# ---- the run -------------------------------------------------------------------------------------


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

    ``model``, ``panel``, ``lab_settings`` and ``train_sampling`` exist for tests (a tiny model, a shorter lab). The second
    lane is a spawned process, so a script that calls this needs the usual ``if __name__ == "__main__":``
    guard."""
    import torch

    from scope_marl.core.machine import gemm_gflops
    from scope_marl.lab.run import run_lab

    started = time.perf_counter()
    gflops = gemm_gflops(repeats=1, best_of=10)
    out = fresh_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    panel = demo_panel(panel)
    convert = needs_conversion(model)
    main_arm, worker_arm = ARMS  # the frozen arm here, the heavier VS arm beside the model conversion
    lanes = {
        MAIN_LANE: [("effect", REFERENCE_SECONDS["effect"]), *plan(main_arm, steps), ("report", REFERENCE_SECONDS["report"])],
        WORKER_LANE: [("convert", REFERENCE_SECONDS["convert"])] * convert + plan(worker_arm, steps),
    }
    progress = Progress(lanes, gflops, log)
    log(
        f"scope demo -> {out}  (torch GEMM {gflops:.0f} GFLOP/s; the target on this machine is {time_limit(gflops):.0f} s; "
        f"~{progress.remaining():.0f} s estimated)"
    )
    log(
        f"two processes: the collapse lab, then the {main_arm} arm | "
        + ("the model conversion (first run only), then " if convert else "")
        + f"the {worker_arm} arm"
    )

    context = multiprocessing.get_context("spawn")
    events = context.Queue()
    listener = threading.Thread(target=_relay, args=(events, progress), daemon=True)
    listener.start()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=_worker_init, initargs=(events,)) as pool:
            try:
                conversion = pool.submit(_worker_convert) if convert else None
                worker = pool.submit(_worker_arm, worker_arm, steps, model, panel, out / "llm", train_sampling)
                lab = run_lab("theory", seeds=seeds, out=out / "effect", log=lambda _: None, settings=lab_settings)
                progress.done(
                    MAIN_LANE, "effect", f"[1/3 effect] collapse lab: {len(lab['arms'])} arms x {seeds} seeds in {lab['seconds']:.0f} s"
                )
                if conversion is not None:
                    conversion.result()  # the main lane's arm needs the converted model too
                report = functools.partial(progress.done, MAIN_LANE)
                arms = {main_arm: train_and_evaluate(main_arm, steps, model, panel, out / "llm", report, train_sampling)}
                arms[worker_arm] = worker.result()  # raises the other process's error, if any
            except BaseException:
                for child in multiprocessing.active_children():  # the pool would wait for the other lane's arm
                    child.terminate()
                raise
    finally:
        torch.set_num_threads(threads)
        events.put(None)
        listener.join()
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


def _relay(events, progress: Progress) -> None:
    """Print the second process's progress events as they come (until the None that ends them)."""
    while (event := events.get()) is not None:
        progress.done(*event)


def train_and_evaluate(
    arm: str, steps: int, model: str, panel: Panel, out: Path, report: Callable[[str, str], None], sampling: dict | None = None
) -> dict:
    """Train one arm ``steps`` GRPO steps into ``out/arm``, then play the held-out panel; its step records and evaluation."""
    from scope_marl.evaluation.evaluate import write_results
    from scope_marl.experiment import evaluate_trainer, start

    trainer = start(arm_config(arm, steps, model, sampling), out / arm)
    report("start", f"[2/3 llm] {arm}: model, simulator and LoRA adapter ready")
    records = []
    try:
        while trainer.step < steps:
            record = trainer.train_step()
            records.append(record)
            t = record["train_agent"]
            report(
                f"step:{arm}",
                f"[2/3 llm] {arm} step {record['step']}/{steps}: reward {record.get('reward_agent', {}).get('mean', float('nan')):.2f}, "
                f"ratio {t.get('ratio_mean', float('nan')):.4f}, log-prob gap {t.get('logprob_gap', float('nan')):.1e}",
            )
    finally:
        trainer.close()
    evaluation = evaluate_trainer(trainer, panel, log=lambda _: None)
    write_results(evaluation, out / arm / "eval")
    held = evaluation["heldout"]["reward"]
    report("eval", f"[2/3 llm] {arm} on {len(panel.simulators)} held-out simulators: reward {held['mean']:.2f}")
    return {"records": records, "heldout": evaluation["heldout"]}


# ---- the report ----------------------------------------------------------------------------------


def result_line(result: dict) -> str:
    """The RESULT line ``scope demo`` ends with (plain decimals, as every bench script's)."""
    digits = {"seconds": 1, "gemm_gflops": 1, "single_heldout_change": 4, "vs_prob_over_single_low": 4, "cotrain_over_single_low": 4}
    return "RESULT " + " ".join(f"{key}={result[key]:.{n}f}" for key, n in digits.items())


def write_demo_report(out: Path, lab: dict, llm: dict, summary: dict) -> Path:
    from scope_marl.evaluation.report import load_runs, report_markdown, write_html, write_plots
    from scope_marl.lab.report import report_markdown as lab_markdown

    runs = load_runs([out / "llm" / arm for arm in llm["arms"]])
    write_plots(runs, out / "llm", "scope demo, part 2: SmolLM2-135M agent, a few GRPO steps per arm")
    text = "\n".join(
        [
            "# scope demo",
            "",
            f"torch GEMM on this machine: {summary['result']['gemm_gflops']:.0f} GFLOP/s. "
            "Part 1 shows the effect the paper is about; part 2 runs the same algorithms on a real LLM; part 3 says where to go next.",
            "",
            "## 1. The effect: simulator collapse and both fixes",
            "",
            "The collapse lab replaces the LLMs by small exact models of them (a persuader policy over strategies, simulators "
            "as reply distributions, a collapsed LLM sharpened towards its modal reply), so every arm trains to the end in "
            "seconds and every number has a 95% interval over seeds.",
            "",
            lab_markdown(lab, level=3, images="effect/"),
            "## 2. The same algorithms on the real LLM",
            "",
            *llm_section(llm),
            report_markdown(runs, title="Held-out evaluation", level=3, images="llm/"),
            "## 3. Where to go next",
            "",
            *NEXT_STEPS,
        ]
    )
    files.write_text(out / "report.md", text)
    write_html(out / "report.md", "scope demo")
    return out / "report.md"


def llm_section(llm: dict) -> list[str]:
    steps = llm["steps"]
    rows = []
    for arm, a in llm["arms"].items():
        for r in a["records"]:
            t = r["train_agent"]
            vs = r.get("simulator", {}).get("verbalized_sampling")
            if t.get("episodes", 0) == 0:  # every episode of the step was left out (e.g. TRUNCATED): nothing trained
                learned = f"- | - | - | - | 0 ({t.get('skipped', 0)} episodes left out)"
            else:
                learned = f"{t['ratio_mean']:.4f} | {t['logprob_gap']:.1e} | {t['kl']:.1e} | {t['grad_norm']:.3f} | {t['trained_tokens']}"
            rows.append(
                f"| {arm} | {r['step']} | {r.get('reward_agent', {}).get('mean', float('nan')):.3f} | {learned} | "
                f"{format(vs['parse_success_rate'], '.2f') if vs else '-'} | {r['rollout_s']:.1f} | {r['update_s']:.1f} |"
            )
    gaps = [r["train_agent"].get("logprob_gap", float("inf")) for a in llm["arms"].values() for r in a["records"]]
    return [
        f"The embedded SmolLM2-135M-Instruct agent trains a LoRA adapter (r 8 on q and v) with GRPO for {steps} steps per arm, "
        "2 tasks x 2 rollouts per step, on one-exchange Persuasion for Good dialogues (the agent's appeal, the persuadee's "
        "answer; reward: the donation it states, as a fraction of $2), against a frozen simulator (`frozen`) and a Verbalized "
        "Sampling simulator (`vs_prob`, k 3). Then each agent plays "
        f"{len(llm['panel'])} held-out simulators ({', '.join(llm['panel'])}) on {HELDOUT_TASKS} test tasks each. Run directories: `llm/`.",
        "",
        "| arm | step | train reward | importance ratio | log-prob gap | KL | grad norm | trained tokens | VS parse rate | rollout s | update s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "**What this shows.** Every stage runs on a real model: batched rollouts against a frozen and a Verbalized "
        "Sampling simulator, the donation reward, GRPO advantages, the LoRA update with its KL to the base, checkpoints "
        "and a held-out panel evaluation. The streams are token-exact: before each update the learner re-scores the "
        f"sampled tokens and finds the rollout's log-probs to within {max(gaps):.1e} (the *log-prob gap*), so the first "
        "step's importance ratio is 1.",
        "",
        f"**What it cannot show at this scale.** {steps} steps of 4 dialogues each do not move a 135M model's rewards beyond "
        f"noise: {separation(llm)} Seeing simulator collapse on an LLM takes hundreds of steps (part 3).",
        "",
    ]


def separation(llm: dict) -> str:
    """Whether the arms' held-out intervals overlap, in words (they almost always do at the demo's size)."""
    cells = {arm: a["heldout"]["reward"] for arm, a in llm["arms"].items()}
    overlap = max(c["low"] for c in cells.values()) <= min(c["high"] for c in cells.values())
    listed = ", ".join(f"{arm} {format_interval(c)}" for arm, c in cells.items())
    if overlap:
        return f"the arms' held-out rewards ({listed}) have overlapping 95% intervals, so no arm is shown better than another."
    return f"the arms' held-out rewards ({listed}) separate here, but over {HELDOUT_TASKS} tasks per simulator that is not evidence."


NEXT_STEPS = [
    "Longer LLM runs, one paper arm per config (hundreds of steps; a GPU helps):",
    "",
    "```",
    "scope train configs/train_p4g_frozen.yaml --out runs/frozen",
    "scope train configs/train_p4g_vs_prob.yaml --out runs/vs_prob",
    "scope train configs/train_p4g_population.yaml --out runs/population",
    "scope eval --checkpoint runs/frozen --panel offline --out runs/frozen/eval",
    "scope report runs/frozen runs/vs_prob runs/population --out runs/report",
    "```",
    "",
    "The paper's held-out panel of six API simulators (needs their API keys): "
    "`scope eval --checkpoint runs/frozen --panel api --out runs/frozen/eval-api`.",
    "",
    "The collapse lab on its own, and on a game estimated from the Persuasion for Good corpus: "
    "`scope lab --game theory --out runs/lab-theory`, `scope lab --game p4g --out runs/lab-p4g`.",
    "",
    "tau2-bench (`configs/train_tau2_retail_*.yaml`) and the CooperBench-style coding task "
    "(`configs/train_coop_*.yaml`, `scope coop score`) run offline too; vLLM is planned (the README's status table says when it lands).",
    "",
]
