"""``scope eval``: one agent (the base model or a trained checkpoint) against every simulator of a panel.

For each simulator: a fixed, seeded subset of the panel's split (test by default), ``samples_per_task``
rollouts per task, and one table row: mean reward and success rate with 95% bootstrap intervals,
pass^k, the agent's policy entropy (mean per-token entropy of its full temperature-scaled
distribution, docs/interfaces.md), the diversity of its turns, and FAILED / TRUNCATED counts. The held-out
aggregate pools the episodes of every simulator not marked ``training``. Intervals resample
tasks (a task's samples are correlated). Seeds derive from the panel seed and each simulator's id,
so evaluating twice gives the same numbers and adding a simulator to a panel leaves the others'
rollouts alone (only coverage against a ``pooled`` reference depends on the whole panel). Evaluation builds its own engines and never
touches a training run's data cursor.
"""

from __future__ import annotations

import functools
import hashlib
import random
import tempfile
import typing
import weakref
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from scope_marl.assembly import ModelCache, build_env, build_simulator
from scope_marl.backends import ChatModel, load_backend
from scope_marl.backends.seat import Seat
from scope_marl.config import ExecutorSettings, RaySettings, RolloutConfig, Split, TrainConfig, load_saved_config
from scope_marl.core import files, run_layout
from scope_marl.core.seeds import derive_seed
from scope_marl.core.types import Episode, EpisodeStatus
from scope_marl.envs import AGENT
from scope_marl.evaluation.diversity import Coverage, diversity
from scope_marl.evaluation.panel import Panel, PanelSimulator, load_panel
from scope_marl.evaluation.stats import format_interval, format_number, mean_with_ci, pass_hat_k_curve, pass_hat_k_intervals
from scope_marl.executor import Executor, LocalExecutor, open_executor, split_blocks
from scope_marl.rollout import RolloutEngine


@dataclass
class AgentUnderTest:
    """The agent to evaluate: the model it plays on, its adapter (None: the model itself), a label,
    and the model pool the panel's simulators load from (the agent's base is registered there, so a
    simulator on the same spec shares the loaded weights with adapters disabled)."""

    chat: ChatModel
    adapter: str | None
    label: str
    models: ModelCache
    step: int | None = None  # the training step it was saved at (None: the untrained base)
    spec: str | None = None  # the base model's spec string: what a Ray worker loads to play this agent

    def recipe(self) -> AgentRecipe:
        """What another process needs to play this agent: the base spec and the agent's own weights."""
        if self.spec is None:
            raise ValueError(f"agent {self.label!r} has no model spec, so Ray workers cannot load it; evaluate it locally")
        if self.adapter is not None:
            config = self.chat.model.peft_config[self.adapter]
            return AgentRecipe(self.spec, self.label, self.step, adapter=self.chat.adapter_tensors(self.adapter), lora=config)
        if self.step is not None and self.models.get(self.spec) is not self.chat:  # a fully fine-tuned copy
            return AgentRecipe(
                self.spec, self.label, self.step, weights={k: v.detach().clone() for k, v in self.chat.model.state_dict().items()}
            )
        return AgentRecipe(self.spec, self.label, self.step)


@dataclass
class AgentRecipe:
    """An agent as data that pickles (base spec, LoRA tensors and config, or every weight): a Ray
    worker rebuilds the agent from it on models it keeps loaded between jobs."""

    spec: str
    label: str
    step: int | None
    adapter: dict | None = None
    lora: object | None = None  # peft.LoraConfig
    weights: dict | None = None

    def build(self, models: ModelCache) -> AgentUnderTest:
        base = models.get(self.spec)
        if self.weights is not None:
            own = load_backend(self.spec, models.placement)
            own.model.load_state_dict(self.weights)
            return AgentUnderTest(own, None, self.label, models, self.step, self.spec)
        if self.adapter is None:
            return AgentUnderTest(base, None, self.label, models, self.step, self.spec)
        # One adapter per LoRA shape, reused by every later job of this worker with new tensors.
        name = "eval-agent-" + hashlib.sha256(repr(sorted(self.lora.to_dict().items(), key=str)).encode()).hexdigest()[:8]
        if name not in base.adapters:
            base.add_adapter(name, self.lora)
        base.set_adapter_tensors(name, self.adapter)
        return AgentUnderTest(base, name, self.label, models, self.step, self.spec)


def load_agent(checkpoint_or_base: str, model: str | None = None, models: ModelCache | None = None, name: str = "agent") -> AgentUnderTest:
    """``base`` (the untrained ``model``, default embedded), a run directory (its best checkpoint,
    else its last), or a checkpoint directory.

    Several agents can share one loaded base: pass the same ``models`` and a distinct adapter ``name`` each.
    """
    models = models or ModelCache()
    if checkpoint_or_base == "base":
        spec = model or "embedded"
        chat = models.get(spec)
        return AgentUnderTest(chat, None, "base", models, spec=spec)
    # A run may still be training: hold the checkpoint before the slow base load, so its pruning of
    # old checkpoints cannot delete this one mid-read (the label names the checkpoint chosen).
    with tempfile.TemporaryDirectory(prefix="scope-eval-hold-") as tmp:
        path, held = run_layout.hold_checkpoint(Path(checkpoint_or_base), Path(tmp))
        run_config = run_layout.run_dir_of(path) / run_layout.CONFIG
        if model is None and not run_config.exists():
            raise FileNotFoundError(
                f"{path} is not inside a run directory (no {run_config}), so its base model is unknown; pass --model SPEC (e.g. --model embedded)"
            )
        spec = model or load_saved_config(run_config, TrainConfig).model
        base = models.get(spec)
        step = run_layout.read_state(held)["step"]
        if run_layout.weights_path(held, "agent").exists():  # full fine-tuning: the agent is its own copy
            agent = load_backend(spec, models.placement)
            agent.load_weights(run_layout.weights_path(held, "agent"))
            return AgentUnderTest(agent, None, str(path), models, step, spec)
        if run_layout.sharded_path(held, "agent").is_dir():  # ... written shard by shard (FSDP2): read whole here
            agent = load_backend(spec, models.placement)
            load_shards(agent.model, run_layout.sharded_path(held, "agent"))
            return AgentUnderTest(agent, None, str(path), models, step, spec)
        base.add_adapter(name, str(run_layout.saved_adapter(held, "agent")))
        return AgentUnderTest(base, name, str(path), models, step, spec)


def load_shards(model, folder: Path) -> None:
    """A sharded run's weights (``torch.distributed.checkpoint``, written by any number of ranks) into one
    whole model in this process: DCP reshards on load, no process group needed."""
    import warnings

    import torch.distributed.checkpoint as dcp

    state = {"model": model.state_dict()}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load(state, checkpoint_id=folder, no_dist=True)
    model.load_state_dict(state["model"])


def simulator_seed(panel_seed: int, simulator_id: str) -> int:
    return derive_seed(panel_seed, simulator_id, bits=31)


def panel_tasks(env, panel: Panel) -> list:
    """A seeded shuffle of the panel's split, first ``tasks_per_simulator`` tasks."""
    tasks = list(env.tasks(panel.split))
    random.Random(panel.seed).shuffle(tasks)
    return tasks[: panel.tasks_per_simulator]


def play(panel: Panel, entry: PanelSimulator, agent: AgentUnderTest, env, block: tuple[int, int] | None = None) -> list[Episode]:
    """Every episode of one panel simulator (or of a block of its tasks, under the group numbers the
    whole run gives them, so blocks played apart give the whole run's episodes)."""
    cfg = entry.simulator
    seed = simulator_seed(panel.seed, entry.id)
    # The panel's seed reaches every random choice: the simulator's own (VS draws, rotation order) too.
    update = {"id": entry.id, "seed": seed}
    if "sampling" in type(cfg).model_fields and cfg.sampling.seed is None:
        update["sampling"] = cfg.sampling.model_copy(update={"seed": seed})  # VS generation seeds from it
    cfg = cfg.model_copy(update={k: v for k, v in update.items() if k in type(cfg).model_fields})
    simulator = build_simulator(cfg, agent.models)
    simulator.simulator_id = entry.id
    seat = Seat(model=agent.chat, sampling=panel.agent_sampling, adapter=agent.adapter, trainable=True)  # streams carry entropies
    rollout = RolloutConfig(
        group_size=panel.samples_per_task, max_concurrent=panel.max_concurrent, seed=seed, on_turn_limit="continue", progress=False
    )
    tasks = panel_tasks(env, panel)
    start, stop = block or (0, len(tasks))
    return RolloutEngine(env, seat, simulator, rollout).run(tasks[start:stop], first_group=start)


_WORKER_MODELS = ModelCache()  # in a Ray worker: models kept loaded from one evaluation job to the next
_ENVIRONMENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # per model pool: one environment per config


def environment(cfg, models: ModelCache):
    """One environment per distinct config (simulators' env overrides may differ) and model pool (an LLM
    judge loads there), kept while that pool lives."""
    built = _ENVIRONMENTS.setdefault(models, {})
    key = cfg.model_dump_json()
    if key not in built:
        built[key] = build_env(cfg, models)
    return built[key]


def play_block(panel: Panel, entry: PanelSimulator, agent: AgentUnderTest | AgentRecipe, env_cfg, block: tuple[int, int]) -> list[Episode]:
    """One (simulator, task block) job of a panel: with the live agent where it lives, or in a Ray worker
    with the agent rebuilt from its recipe on the models the worker keeps loaded."""
    if isinstance(agent, AgentRecipe):
        agent = agent.build(_WORKER_MODELS)
    return play(panel, entry, agent, environment(env_cfg, agent.models), block)


def agent_turns(episodes: Sequence[Episode]) -> tuple[list[str], list[str]]:
    """All of the agent's messages, and each episode's first agent message (its opening)."""
    turns, openings = [], []
    for e in episodes:
        mine = [m.content for m in e.messages if m.role == AGENT]
        turns += mine
        openings += mine[:1]
    return turns, openings


def succeeded(episode: Episode) -> bool:
    """A completed episode's success: the environment's verdict if it gives one, else agent reward > 0."""
    verdict = episode.metadata.get("success")
    return bool(verdict) if verdict is not None else episode.rewards.get(AGENT, 0.0) > 0


def score(episodes: Sequence[Episode], coverage: Coverage | None, seed: int) -> dict:
    """One table row. Reward and success are over COMPLETED episodes (the others have no reward);
    success is the environment's own verdict when it records one (``metadata["success"]``; tau2: its
    reward is 1, whatever a malformed-call penalty took from the agent's reward), else an agent reward
    above 0 (P4G: a donation). pass^k counts a FAILED or TRUNCATED sample as a failure of its task."""
    completed = [e for e in episodes if e.status == EpisodeStatus.COMPLETED and AGENT in e.rewards]
    rewards = [e.rewards[AGENT] for e in completed]
    tasks = [(e.simulator_id, e.task_id) for e in completed]  # the bootstrap resamples tasks, not samples
    by_task: dict[tuple, list[bool]] = defaultdict(list)
    for e in episodes:
        by_task[(e.simulator_id, e.task_id)].append(e.status == EpisodeStatus.COMPLETED and AGENT in e.rewards and succeeded(e))
    entropies = [h for e in episodes if AGENT in e.streams for h, m in zip(e.streams[AGENT].entropies, e.streams[AGENT].loss_mask) if m]
    turns, openings = agent_turns(episodes)
    count = {s: sum(e.status == s for e in episodes) for s in EpisodeStatus}
    return {
        "episodes": len(episodes),
        "completed": count[EpisodeStatus.COMPLETED],
        "failed": count[EpisodeStatus.FAILED],
        "truncated": count[EpisodeStatus.TRUNCATED],
        "reward": mean_with_ci(rewards, seed=seed, groups=tasks),
        "success": mean_with_ci([float(succeeded(e)) for e in completed], seed=seed, groups=tasks),
        "pass_k": pass_hat_k_curve([(sum(v), len(v)) for v in by_task.values()]),
        "pass_k_ci": pass_hat_k_intervals([(sum(v), len(v)) for v in by_task.values()], seed=seed),
        "policy_entropy": sum(entropies) / len(entropies) if entropies else None,
        "agent_tokens": len(entropies),
        "diversity": diversity(turns, openings, coverage),
    }


def build_coverage(panel: Panel, env, episodes: Sequence[Episode]) -> Coverage | None:
    reference = env.reference_texts(AGENT) if panel.coverage.reference == "env" else []
    source = "env" if reference else "pooled"
    if not reference:
        reference = agent_turns(episodes)[0]
    try:
        coverage = Coverage(reference, k=panel.coverage.clusters, encoder=panel.coverage.encoder, seed=panel.seed)
    except ValueError:
        return None  # fewer than two distinct texts: nothing to cluster
    coverage.source = source
    return coverage


def evaluate_panel(panel: Panel, agent: AgentUnderTest, log: Callable[[str], None] = print, executor: Executor | None = None) -> dict:
    """Play the whole panel as (simulator, task block) jobs on ``executor`` (default: this process) and
    score it. Every group keeps its number, so the episodes are the same wherever the jobs run."""
    executor = executor or LocalExecutor()
    env_cfgs = {entry.id: type(panel.env).model_validate({**panel.env.model_dump(), **entry.env}) for entry in panel.simulators}
    played = play_panel(panel, agent, env_cfgs, executor, log)
    all_episodes = [e for eps in played.values() for e in eps]
    coverage = build_coverage(panel, environment(panel.env, agent.models), all_episodes)
    heldout_ids = [s.id for s in panel.simulators if not s.training]
    return {
        "agent": agent.label,
        "step": agent.step,
        "panel": panel.name,
        "env": panel.env.name + (f" {panel.env.domain}" if hasattr(panel.env, "domain") else ""),
        "split": panel.split,
        "seed": panel.seed,
        "coverage_reference": getattr(coverage, "source", None),
        "simulators": {
            s.id: {"training": s.training, **score(played[s.id], coverage, simulator_seed(panel.seed, s.id))} for s in panel.simulators
        },
        "heldout": {"simulators": heldout_ids, **score([e for i in heldout_ids for e in played[i]], coverage, panel.seed)},
        "all": score(all_episodes, coverage, panel.seed),
    }


def play_panel(
    panel: Panel, agent: AgentUnderTest, env_cfgs: dict, executor: Executor, log: Callable[[str], None]
) -> dict[str, list[Episode]]:
    """Every panel simulator's episodes, played as (simulator, task block) jobs on the executor: each
    simulator's tasks cut into enough blocks that every player has a job (one block each in this process)."""
    carried = executor.portable(agent)
    per_simulator = -(-executor.parallelism // len(panel.simulators))
    jobs, owners = [], []
    for entry in panel.simulators:
        count = len(panel_tasks(environment(env_cfgs[entry.id], agent.models), panel))
        for block in split_blocks(count, min(per_simulator, max(count, 1))):
            jobs.append(functools.partial(play_block, panel, entry, carried, env_cfgs[entry.id], block))
            owners.append(entry.id)
    log(f"evaluating {agent.label} against {len(panel.simulators)} simulator(s): {len(jobs)} jobs on {executor.describe()}")
    played: dict[str, list[Episode]] = {entry.id: [] for entry in panel.simulators}
    for owner, episodes in zip(owners, executor.map(jobs)):
        played[owner] += episodes
    return played


def compact(results: dict) -> dict:
    """The fields a metrics line keeps of an evaluation: held-out mean reward and entropy up front,
    and per simulator its reward cell (the full results go to scope eval's JSON)."""
    heldout = results["heldout"]
    return {
        "panel": results["panel"],
        "reward_agent": heldout["reward"]["mean"],
        "policy_entropy": heldout["policy_entropy"],
        "heldout": {
            "reward": heldout["reward"],
            "success": heldout["success"],
            "policy_entropy": heldout["policy_entropy"],
            "episodes": heldout["episodes"],
            "simulators": heldout["simulators"],
        },
        "simulators": {
            sid: {"training": r["training"], "reward": r["reward"], "policy_entropy": r["policy_entropy"]}
            for sid, r in results["simulators"].items()
        },
    }


def markdown(results: dict) -> str:
    """The evaluation as a markdown table, one row per simulator plus the aggregates."""
    k_max = max((max(map(int, r["pass_k"]), default=0) for r in results["simulators"].values()), default=0)
    head = [
        "simulator",
        "training",
        "episodes",
        "reward [95% CI]",
        "success [95% CI]",
        *[f"pass^{k} [95% CI]" for k in range(1, k_max + 1)],
        "policy entropy",
        "distinct-1",
        "distinct-2",
        "unique openings",
        "coverage",
        "failed",
        "truncated",
    ]
    lines = [
        f"# Evaluation of `{results['agent']}` on panel `{results['panel']}` "
        f"({results.get('env', '')}{', ' if results.get('env') else ''}{results['split']} split, seed {results['seed']})",
        "",
        f"Coverage: share of {results.get('coverage_reference') or '-'} reference clusters reached by the agent's turns.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    rows = [(sid, r, "yes" if r["training"] else "no") for sid, r in results["simulators"].items()]
    rows += [("**held-out**", results["heldout"], ""), ("**all**", results["all"], "")]
    for name, r, training in rows:
        d = r["diversity"]
        intervals = r.get("pass_k_ci", {})
        passes = [
            format_interval(intervals.get(k, intervals.get(str(k))))
            if intervals
            else format_number(r["pass_k"].get(k, r["pass_k"].get(str(k))))
            for k in range(1, k_max + 1)
        ]
        lines.append(
            "| "
            + " | ".join(
                [
                    name,
                    training,
                    str(r["episodes"]),
                    format_interval(r["reward"]),
                    format_interval(r["success"]),
                    *passes,
                    format_number(r["policy_entropy"]),
                    format_number(d["distinct_1"]),
                    format_number(d["distinct_2"]),
                    format_number(d["unique_openings"]),
                    format_number(d["coverage"]),
                    str(r["failed"]),
                    str(r["truncated"]),
                ]
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def evaluate_checkpoint(
    checkpoint: str,
    panel: str,
    out: Path,
    model: str | None = None,
    overrides: dict | None = None,
    splits: Sequence[str] = (),
    training: Sequence[str] = (),
    ray: RaySettings | None = None,
    log: Callable[[str], None] = print,
) -> tuple[Path, list[Path]]:
    """``scope eval``: an agent (``base``, a run directory or a checkpoint) against a panel (a YAML path or a
    built-in name) with its ``overrides`` (panel fields), on each of ``splits`` (default: the panel's),
    ``training`` naming panel simulators used in training; on Ray workers with ``ray``. Writes
    ``eval.json`` and ``eval.md`` (several splits: one folder each and one ``eval.md``); returns the
    report and the JSON files."""
    chosen = load_panel(panel)
    chosen = type(chosen).model_validate({**chosen.model_dump(), **(overrides or {})}).with_training(set(training))
    unknown = set(training) - {s.id for s in chosen.simulators}
    if unknown:
        raise ValueError(f"--training {sorted(unknown)} not in the panel; its simulators: {', '.join(s.id for s in chosen.simulators)}")
    allowed = typing.get_args(Split)
    unknown_splits = [s for s in splits if s not in allowed]
    if unknown_splits:
        raise ValueError(f"--split {unknown_splits[0]!r} is not a split; use one of {', '.join(allowed)}")
    splits = list(dict.fromkeys(splits)) or [chosen.split]
    agent = load_agent(checkpoint, model)
    if agent.step is not None:
        log(f"agent: {agent.label} (step {agent.step})")
    where = ExecutorSettings(executor="ray", ray=ray) if ray is not None else ExecutorSettings()
    executor = open_executor(where, factory=None)  # jobs only: each job builds what it plays
    try:
        by_split = {}
        for name in splits:
            log(f"split {name}")
            by_split[name] = evaluate_panel(chosen.model_copy(update={"split": name}), agent, log=log, executor=executor)
            if len(splits) > 1:  # each split is written as soon as it is done: a later failure loses none of it
                write_split_results(by_split, out)
    finally:
        executor.close()
    if len(by_split) == 1:
        return write_results(by_split[splits[0]], out), [out / "eval.json"]
    return write_split_results(by_split, out), [out / s / "eval.json" for s in splits]


def write_results(results: dict, out: Path) -> Path:
    files.write_json(out / "eval.json", results)
    return files.write_text(out / "eval.md", markdown(results))


def write_split_results(by_split: dict[str, dict], out: Path) -> Path:
    """Several splits: each split's eval.json / eval.md under ``OUT/<split>/``, and ``OUT/eval.md``
    with every split's table (rewritten as splits are added)."""
    for split, results in by_split.items():
        write_results(results, out / split)
    return files.write_text(out / "eval.md", "\n".join(markdown(r) for r in by_split.values()))
