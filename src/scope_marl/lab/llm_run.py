"""``scope lab --policy llm``: the collapse lab with the embedded LLM as the agent, every arm over seeds.

Writes, in ``out``: ``settings.json`` (a resumed run must use the same), ``start.json`` (the untrained
agent's evaluation, shared by every arm and seed), one directory per arm and seed (``llm_loop``:
checkpoint after every step, ``result.json`` when done), and at the end ``results.json``,
``report.md``, ``report.html`` and ``collapse.png``. Run it again with the same ``out`` to resume.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from scope_marl.backends.hf import HFChatModel
from scope_marl.core import files
from scope_marl.core.machine import gemm_gflops
from scope_marl.evaluation.report import write_html
from scope_marl.lab.arms import ARMS, LLM_QUICK, LLM_SETTINGS, LLMSettings
from scope_marl.lab.games import load_game
from scope_marl.lab.llm_agent import LLMAgent
from scope_marl.lab.llm_loop import RESULT_FILE, evaluate_llm, reset_adapter, train_llm_arm
from scope_marl.lab.panel import HELDOUT_PANEL, build_panel, load_panel
from scope_marl.lab.report import llm_report_markdown, plot_llm
from scope_marl.lab.run import checked_arms, paired_with_single, panel_file, summarize
from scope_marl.training.run_dir import RunDir

LLM_ARMS = ("single", "vs_prob", "rotation", "cotrain", "population")
LLM_METRICS = ("train_reward", "heldout_reward", "strategy_entropy", "distinct2", "other_share")


class SettingsMismatch(ValueError):
    """``out`` holds a run with other settings: resuming it would mix two experiments."""


def run_llm_lab(
    game: str = "theory",
    arms: list[str] | None = None,
    seeds: int = 3,
    out: Path = Path("runs/lab-llm"),
    quick: bool = False,
    settings: LLMSettings | None = None,
    chat: HFChatModel | None = None,
    panel: str | Path | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """Train every arm with ``seeds`` seeds (resuming whatever ``out`` already holds) and write the report.

    ``chat`` is the agent's model (default: the embedded SmolLM2-135M-Instruct); ``quick`` uses
    :data:`LLM_QUICK` (fewer steps and dialogues), ``settings`` replaces the game's LLM settings.
    """
    started = time.perf_counter()
    arms = checked_arms(arms or LLM_ARMS, ARMS, seeds)
    lab_game = load_game(game)
    s = settings or LLM_SETTINGS[game]
    if quick:
        s = s.replace(**LLM_QUICK)
    panel_spec = load_panel(panel if panel is not None else HELDOUT_PANEL)
    members = build_panel(lab_game, panel_spec)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    identity = {"game": game, "settings": s.model_dump(mode="json"), "panel": panel_spec.model_dump()}
    check_settings(out, identity)

    warm = None
    if chat is None and s.warm_start:
        chat, warm = warm_started(lab_game, s, out / "warm-start", log)
    elif chat is None:
        from scope_marl.backends.embedded import load_embedded

        chat = load_embedded()
    start_path = out / "start.json"
    if start_path.exists():
        start = json.loads(start_path.read_text())
    else:
        t0 = time.perf_counter()
        reset_adapter(chat, s, seed=0)
        start = evaluate_llm(LLMAgent(chat, lab_game, max_new_tokens=s.max_new_tokens, temperature=s.temperature), lab_game, members, s)
        start["seconds"] = time.perf_counter() - t0
        files.write_json(start_path, start)

    total = len(arms) * seeds * s.steps
    done = sum(steps_done(out / run_name(arm, seed), s.steps) for arm in arms for seed in range(seeds))
    timed = {"steps": 0, "seconds": 0.0}
    per_arm = {}
    for arm in arms:
        runs = []
        for seed in range(seeds):

            def progress(step: int, seconds: float, arm=arm, seed=seed) -> None:
                nonlocal done
                done += 1
                timed["steps"] += 1
                timed["seconds"] += seconds
                eta = (total - done) * timed["seconds"] / timed["steps"]
                log(f"[lab-llm {game}] {arm} seed {seed} step {step}/{s.steps}  {seconds:.1f}s  ({done}/{total} steps, ETA {clock(eta)})")

            run = train_llm_arm(chat, lab_game, arm, seed, s, members, out / run_name(arm, seed), start, progress)
            runs.append(run)
            f = run["final"]
            log(
                f"[lab-llm {game}] {arm:10s} seed {seed}: train {f['train_reward']:.3f}  held-out {f['heldout_reward']:.3f}  "
                f"strategy entropy {f['strategy_entropy']:.3f}  other {f['other_share']:.2f}"
            )
        per_arm[arm] = {"summary": summarize(runs, LLM_METRICS), "runs": runs}
    paired_with_single(per_arm)
    results = {
        "game": game,
        "policy": "llm",
        "arms": arms,
        "seeds": seeds,
        "settings": s.model_dump(mode="json"),
        "panel": panel_spec.model_dump(),
        "panel_file": panel_file(panel),
        "interval": "95% Student-t interval over seeds",
        "start": start,
        "warm_start": warm,
        "results": {arm: r["summary"] for arm, r in per_arm.items()},
        "examples": {arm: {"start": start["examples"], "end": [r["final"]["examples"] for r in a["runs"]]} for arm, a in per_arm.items()},
        "max_logprob_gap": max(r["max_logprob_gap"] for a in per_arm.values() for r in a["runs"]),
        # Training and evaluation time summed over every session that worked on this directory.
        "seconds": start["seconds"] + sum(r["seconds"] for a in per_arm.values() for r in a["runs"]),
        "seconds_this_session": time.perf_counter() - started,
        "gemm_gflops": gemm_gflops(),
        "torch_threads": torch.get_num_threads(),
    }
    files.write_json(out / "results.json", results, indent=1)
    plot_llm(results, out / "collapse.png")
    files.write_text(out / "report.md", llm_report_markdown(results))
    write_html(out / "report.md", f"Collapse lab with an LLM agent: {game}")
    return results


def warm_started(game, s: LLMSettings, folder: Path, log: Callable[[str], None]) -> tuple[HFChatModel, dict]:
    """The warm-started agent's model (made once in ``folder``) and its report: the classifier's
    agreement with the messages' labels per split, and the strategy shares of 256 sampled first messages."""
    from scope_marl.backends import load_backend
    from scope_marl.lab.warm_start import classifier_agreement, first_message_shares, warm_start_model

    model = warm_start_model(game, folder, s.warm_start_lr, s.warm_start_epochs, log=log)
    chat = load_backend(f"hf:{model}")
    report_path = folder / "report.json"
    if report_path.is_file():
        return chat, json.loads(report_path.read_text())
    report = {
        "classifier_agreement": classifier_agreement(game),
        "first_messages": first_message_shares(chat, game, 256, max_new_tokens=s.max_new_tokens, temperature=s.temperature),
    }
    files.write_json(report_path, report, indent=1)
    return chat, report


def check_settings(out: Path, identity: dict) -> None:
    path = out / "settings.json"
    if path.exists():
        saved = json.loads(path.read_text())
        if saved != identity:
            changed = sorted(k for k in identity["settings"] if saved.get("settings", {}).get(k) != identity["settings"][k])
            raise SettingsMismatch(
                f"{out} holds an LLM lab run with other settings (differs in: {', '.join(changed) or 'game or panel'}); "
                "resume it with the same settings, or choose a new --out"
            )
    else:
        files.write_json(path, identity)


def run_name(arm: str, seed: int) -> str:
    return f"{arm}-seed{seed}"


def steps_done(workdir: Path, steps: int) -> int:
    """Steps a run directory already holds (for the ETA of a resumed run)."""
    return steps if (workdir / RESULT_FILE).exists() else RunDir(workdir).checkpointed_step()


def clock(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{int(seconds % 60):02d}s"
