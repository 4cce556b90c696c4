"""The demo's report: report.md, a self-contained report.html and the plots, and the RESULT line.

Part 1 is the collapse lab's own report; part 2 tabulates the LLM arms' steps and held-out
evaluation (``scope report``'s tables and plots) and says what a few steps can and cannot show;
part 3 lists the commands for longer runs.
"""

from __future__ import annotations

from pathlib import Path

from scope_marl.core import files
from scope_marl.demo.arms import HELDOUT_TASKS
from scope_marl.evaluation.stats import format_interval


def result_line(result: dict) -> str:
    """The RESULT line ``scope demo`` ends with (plain decimals, as every bench script's)."""
    digits = {"seconds": 1, "gemm_gflops": 1, "single_heldout_change": 4, "vs_prob_over_single_low": 4, "cotrain_over_single_low": 4}
    return "RESULT " + " ".join(f"{key}={result[key]:.{n}f}" for key, n in digits.items())


def closing_lines(summary: dict) -> list[str]:
    """What ``scope demo`` prints after its progress lines: the lab's table, each LLM arm's held-out
    reward, where the report is, and the RESULT line last."""
    from scope_marl.lab import format_table

    lines = ["", format_table(summary["lab"]), ""]
    for arm, a in summary["llm"]["arms"].items():
        held = a["heldout"]["reward"]
        lines.append(f"LLM {arm}: held-out reward {held['mean']:.3f} [{held['low']:.3f}, {held['high']:.3f}]")
    result = summary["result"]
    lines.append(
        f"report: {Path(summary['out']) / 'report.html'} (and report.md) in {result['seconds']:.0f} s; "
        f"the target on this machine (GEMM {result['gemm_gflops']:.0f} GFLOP/s) is {result['time_limit_s']:.0f} s"
    )
    return [*lines, result_line(result)]


def write_demo_report(out: Path, lab: dict, llm: dict, summary: dict) -> Path:
    """report.md (the three parts), report.html with the plots embedded, and part 2's plots under ``llm/``."""
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
    "(`configs/train_coop_*.yaml`, `scope coop score`) run offline too.",
    "",
    "Rollouts on a vLLM server: `scope serve vllm --model embedded --port 8001` (vLLM in its own venv), then `sampler: vllm:embedded@http://127.0.0.1:8001` in a training config (`configs/gpu/train_p4g_cotrain_vllm.yaml`; "
    "tested on CPUs, not yet on a GPU, as the README's status table says).",
    "",
]
