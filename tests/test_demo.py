"""``scope demo``: its three parts, the RESULT line's direction, the self-contained HTML report, the
time estimates, the arms' YAML configs, the two-lane scheduler's failure path; and once end to end on
the real embedded model through the CLI."""

from __future__ import annotations

import base64
import fnmatch
import json
import multiprocessing
import operator
import os
import re
import subprocess
import sys
import time
import tomllib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from scope_marl import demo
from scope_marl.config import TrainConfig, load_config
from scope_marl.evaluation.panel import Panel
from scope_marl.evaluation.report import markdown_to_html
from scope_marl.lab.arms import with_settings

RESULT = re.compile(
    r"^RESULT seconds=(\d+\.\d+) gemm_gflops=(\d+\.\d+) single_heldout_change=(-?\d+\.\d+) "
    r"vs_prob_over_single_low=(-?\d+\.\d+) cotrain_over_single_low=(-?\d+\.\d+)$"
)


class Page(HTMLParser):
    """The images, tables and header cells of an HTML page."""

    def __init__(self):
        super().__init__()
        self.images, self.tables, self.headers, self.links = [], 0, [], []
        self._in_th = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        elif tag == "table":
            self.tables += 1
        elif tag == "th":
            self._in_th = True
            self.headers.append("")
        elif tag in ("link", "script") and (attrs.get("href") or attrs.get("src")):
            self.links.append(attrs.get("href") or attrs.get("src"))

    def handle_endtag(self, tag):
        if tag == "th":
            self._in_th = False

    def handle_data(self, data):
        if self._in_th:
            self.headers[-1] += data


def read_page(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text())
    return page


def markdown_tables(text: str) -> list[list[str]]:
    """The header cells of every table in a markdown text."""
    lines = text.splitlines()
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line, below in zip(lines, lines[1:])
        if line.startswith("|") and re.fullmatch(r"\|(---\|)+", below.strip())
    ]


@pytest.fixture(scope="module")
def tiny_demo(tiny_model_dir, tmp_path_factory):
    """The whole demo on the tiny random model, with the lab shortened to 3 seeds and a lighter evaluation."""
    model = f"hf:{tiny_model_dir}"
    sampling = {"temperature": 1.0, "max_new_tokens": 6}
    panel = Panel.model_validate(
        {
            "name": "tiny",
            "simulators": [
                {"id": "a", "simulator": {"mode": "frozen", "model": model, "sampling": sampling}},
                {"id": "b", "simulator": {"mode": "persona_guided", "model": model, "sampling": sampling}},
            ],
        }
    )
    lines: list[str] = []
    out = tmp_path_factory.mktemp("demo") / "demo"
    lab = with_settings("theory", eval_every=75, eval_groups=16)  # the default 150 steps: co-training needs them
    plain = {"temperature": 1.0, "top_p": 1.0}  # the random model's top-p nucleus is often one newline token
    summary = demo.run_demo(out, steps=1, seeds=3, log=lines.append, model=model, panel=panel, lab_settings=lab, train_sampling=plain)
    return Path(summary["out"]), summary, lines


@pytest.mark.integration
def test_demo_result_shows_collapse_and_both_fixes(tiny_demo):
    """The RESULT's direction: single's held-out reward falls; VS prob and co-training end above single
    (the lower ends of their paired 95% intervals are above 0)."""
    out, summary, _ = tiny_demo
    line = demo.result_line(summary["result"])
    match = RESULT.match(line)
    assert match, line
    seconds, gflops, change, vs_low, cotrain_low = map(float, match.groups())
    assert change < 0 and vs_low > 0 and cotrain_low > 0, line
    assert seconds > 0 and gflops > 0
    saved = json.loads((out / "demo.json").read_text())
    assert saved["result"]["single_heldout_change"] == pytest.approx(change, abs=1e-4)
    lab = json.loads((out / "effect" / "results.json").read_text())
    assert lab["seeds"] == 3 and set(lab["arms"]) == {"single", "rotation", "vs_prob", "vs_random", "cotrain", "population"}


@pytest.mark.integration
def test_demo_trains_both_llm_arms_on_policy_and_evaluates_them(tiny_demo):
    out, summary, lines = tiny_demo
    assert list(summary["llm"]["arms"]) == ["frozen", "vs_prob"]
    for arm in ("frozen", "vs_prob"):
        record = json.loads((out / "llm" / arm / "metrics.jsonl").read_text().splitlines()[0])
        assert record["train_agent"]["logprob_gap"] < 1e-4, "the learner scores exactly the sampled tokens"
        assert record["train_agent"]["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
        evaluation = json.loads((out / "llm" / arm / "eval" / "eval.json").read_text())
        assert evaluation["heldout"]["simulators"] == ["a", "b"] and evaluation["heldout"]["episodes"] == 2 * demo.HELDOUT_TASKS
    assert "verbalized_sampling" in json.loads((out / "llm" / "vs_prob" / "metrics.jsonl").read_text().splitlines()[0])["simulator"]
    parts = [line for line in lines if line.startswith("[")]
    assert sum(line.startswith("[1/3 effect]") for line in parts) == 1 and parts[-1].startswith("[3/3 report]")
    for arm in ("frozen", "vs_prob"):  # each lane's stages, in order, whichever process ran them
        mine = [line for line in parts if line.startswith(f"[2/3 llm] {arm}")]
        assert [line.split(":")[0].split(" ", 2)[-1] for line in mine] == [arm, f"{arm} step 1/1", f"{arm} on 2 held-out simulators"]
    assert all(re.search(r"\| \d+ s elapsed, ~\d+ s left$", line) for line in parts), parts


@pytest.mark.integration
def test_report_html_embeds_every_plot_and_holds_every_table(tiny_demo):
    out, _, _ = tiny_demo
    text = (out / "report.md").read_text()
    for heading in ("## 1. The effect", "## 2. The same algorithms on the real LLM", "## 3. Where to go next"):
        assert heading in text
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert sorted(images) == ["effect/collapse.png", "llm/collapse.png", "llm/heldout.png"]
    page = read_page(out / "report.html")
    assert len(page.images) == len(images) and not page.links
    for src, name in zip(page.images, images):
        assert src.startswith("data:image/png;base64,"), src[:40]
        assert base64.b64decode(src.split(",", 1)[1]) == (out / name).read_bytes()
    tables = markdown_tables(text)
    assert page.tables == len(tables) >= 5
    for header in tables:
        assert all(cell in page.headers for cell in header), header
    assert "held-out - single" in page.headers and "log-prob gap" in page.headers


def test_html_names_an_image_that_was_never_written(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing\.png, which was not written"):
        markdown_to_html("![plot](missing.png)\n", tmp_path, "t")


def test_progress_scales_reference_times_by_gemm_and_corrects_itself():
    now = [0.0]
    lines: list[str] = []
    lanes = {"main": [("a", 10.0), ("b", 20.0)], "worker": [("c", 16.0)]}
    progress = demo.Progress(lanes, gflops=2 * demo.REFERENCE_GFLOPS, log=lines.append, clock=lambda: now[0], prior=0.0)
    assert progress.remaining() == pytest.approx(15.0), "twice the reference GEMM: half the reference time of the longest lane"
    now[0] = 10.0  # stage a took twice its 5 s estimate: the rest is estimated twice as long too
    progress.done("main", "a", "[a] done")
    assert progress.remaining() == pytest.approx(20.0), "main: 20 s of reference left, x 0.5 for GEMM, x 2 for the correction"
    assert lines == ["[a] done | 10 s elapsed, ~20 s left"]
    now[0] = 12.0
    progress.done("main", "b", "[b] done")  # 2 s against 10 estimated: the lanes' totals set the correction
    assert progress.remaining() == pytest.approx(8.0 * 12.0 / 15.0)
    damped = demo.Progress(lanes, gflops=2 * demo.REFERENCE_GFLOPS, log=lines.append, clock=lambda: now[0], prior=20.0)
    now[0] = 22.0  # 10 s for a 5 s stage: undamped the rest would double to 20 s; damped it moves part of the way
    damped.done("main", "a", "[a] done")
    assert 10.0 < damped.remaining() < 20.0


def test_time_limit_is_five_minutes_at_70_gflops():
    assert demo.time_limit(70.0) == 300.0
    assert demo.time_limit(342.0) == pytest.approx(61.4, abs=0.1)


def test_progress_counts_stages_done_together_as_one_stretch_of_time():
    now = [0.0]
    lines: list[str] = []
    lanes = {"main": [("a", 10.0), ("b", 20.0), ("c", 10.0)]}
    progress = demo.Progress(lanes, gflops=demo.REFERENCE_GFLOPS, log=lines.append, clock=lambda: now[0], prior=0.0)
    now[0] = 60.0  # a and b (30 s of reference) took 60 s: the rest is estimated twice as long
    progress.done_together("main", [("a", "[a] done"), ("b", "[b] done")])
    assert lines == ["[a] done | 60 s elapsed, ~20 s left", "[b] done | 60 s elapsed, ~20 s left"]


# ---- the LLM arms: YAML configs --------------------------------------------------------------------


def arm_config_before_yaml(arm: str, steps: int, model: str = "embedded", sampling: dict | None = None) -> TrainConfig:
    """A frozen copy of the arm configs demo.py wrote in code before they became YAML (commit 3726899)."""
    train_sampling = {"temperature": 0.7, "top_p": 0.95, "max_new_tokens": 16}
    arms = {
        "frozen": {"mode": "frozen", "id": "train-frozen", "sampling": train_sampling},
        "vs_prob": {"mode": "vs", "id": "train-vs", "k": 3, "method": "prob", "sampling": {**train_sampling, "max_new_tokens": 10}},
    }
    simulator = {**arms[arm], "model": model}
    if sampling is not None:
        simulator["sampling"] = {**simulator["sampling"], **sampling}
    return TrainConfig.model_validate(
        {
            "model": model,
            "env": {"name": "p4g", "max_exchanges": 1, "word_limit": 20},
            "agent_sampling": {**train_sampling, **(sampling or {})},
            "simulator": simulator,
            "lora": {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]},
            "learner": {"lr": 1e-4, "kl_coef": 0.01, "token_budget": 512},
            "rollout": {"group_size": 2, "max_concurrent": 16, "on_turn_limit": "continue", "progress": False},
            "tasks_per_step": 2,
            "steps": steps,
            "eval": {"every": 0},
            "checkpoint_every": steps,
            "seed": 0,
        }
    )


@pytest.mark.parametrize("arm", demo.ARMS)
@pytest.mark.parametrize(
    "steps,model,sampling",
    [(2, "embedded", None), (1, "hf:/models/tiny", {"temperature": 1.0, "top_p": 1.0}), (5, "embedded", {"max_new_tokens": 6})],
)
def test_an_arm_is_its_yaml_with_the_demos_steps_model_and_sampling(arm, steps, model, sampling):
    assert demo.arm_config(arm, steps, model, sampling) == arm_config_before_yaml(arm, steps, model, sampling)


def test_the_arm_yamls_are_whole_train_configs_that_ship_with_the_package():
    folder = demo.arms.CONFIGS
    assert sorted(p.stem for p in folder.glob("*.yaml")) == sorted(demo.ARMS)
    for arm in demo.ARMS:
        cfg = load_config(folder / f"{arm}.yaml", TrainConfig)
        assert cfg == demo.arm_config(arm, 2), "the YAML is the demo's arm at its default 2 steps"
        assert cfg.env.max_exchanges == 1 and cfg.eval.every == 0 and cfg.steps == cfg.checkpoint_every
    assert {load_config(folder / f"{arm}.yaml", TrainConfig).simulator.mode for arm in demo.ARMS} == {"frozen", "vs"}
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["scope_marl.demo"]
    assert all(any(fnmatch.fnmatch(f"configs/{arm}.yaml", p) for p in patterns) for arm in demo.ARMS), "scope demo reads them at run time"


# ---- the two lanes ---------------------------------------------------------------------------------


@pytest.mark.integration
def test_the_worker_lanes_progress_reaches_this_process_and_torch_threads_come_back():
    import torch

    lines: list[str] = []
    progress = demo.Progress({"main": [("a", 1.0)], "worker": [("b", 1.0)]}, gflops=demo.REFERENCE_GFLOPS, log=lines.append)
    threads = torch.get_num_threads()
    with demo.TwoLanes(progress, threads=1) as lanes:
        job = lanes.submit(demo.scheduler.worker_report, ("b", "[b] done in the worker"))
        assert torch.get_num_threads() == 1, "the main lane's torch runs on one thread too"
        lanes.report(("a", "[a] done here"))
        job.result()
    assert torch.get_num_threads() == threads
    assert sorted(line.split(" |")[0] for line in lines) == ["[a] done here", "[b] done in the worker"]


@pytest.mark.integration
@pytest.mark.parametrize("failing", ["main lane", "worker job"])
def test_a_failing_demo_ends_its_own_worker_and_no_other_process(failing):
    """The failure path terminates the worker process the lanes started (the pool would wait for its
    job), and leaves every other child of this process alone."""
    bystander = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(300,), daemon=True)
    bystander.start()
    try:
        progress = demo.Progress({"main": [], "worker": []}, gflops=demo.REFERENCE_GFLOPS, log=lambda _: None)
        started = time.perf_counter()
        with pytest.raises(ZeroDivisionError), demo.TwoLanes(progress, threads=None) as lanes:
            raising = lanes.submit(operator.truediv, 1, 0)  # a cheap job that raises
            lanes.submit(time.sleep, 300)  # the next job: the pool would wait minutes for it
            workers = lanes.processes()
            if failing == "worker job":
                raising.result()  # the worker's error, raised here
            raise ZeroDivisionError("the main lane fails")
        assert time.perf_counter() - started < 120, "the worker's long job was cut short"
        assert len(workers) == 1
        workers[0].join(timeout=30)
        assert workers[0].exitcode is not None, "the lanes' own worker process is ended"
        assert bystander.is_alive(), "a process the lanes did not start is left alone"
    finally:
        bystander.terminate()
        bystander.join()


@pytest.mark.integration
@pytest.mark.slow
def test_scope_demo_on_the_embedded_model_from_an_empty_cache(tmp_path):
    """The README's main job, end to end through the CLI, converting the model into an empty cache."""
    env = {**os.environ, "SCOPE_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "scope_marl.cli", "demo", "--out", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    match = RESULT.match(last)
    assert match, last
    _, _, change, vs_low, cotrain_low = map(float, match.groups())
    assert change < 0 and vs_low > 0 and cotrain_low > 0, last
    assert "embedded model converted into the cache" in done.stdout
    for name in (
        "report.md",
        "report.html",
        "effect/collapse.png",
        "llm/heldout.png",
        "llm/frozen/eval/eval.json",
        "llm/vs_prob/eval/eval.json",
    ):
        assert (tmp_path / "demo" / name).exists(), name
    assert "Converting and de-quantizing" not in done.stdout + done.stderr, "the conversion's progress bars stay out of the demo's lines"
