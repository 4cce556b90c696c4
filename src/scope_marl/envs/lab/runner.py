"""The collapse lab's training loop: six arms x several seeds, a held-out panel, a report.

Each arm trains the same small strategy policy with the *shared* GRPO code
(:func:`group_advantages`, :func:`policy_loss`) against a different supply of user simulators,
built from the *shared* simulator classes (:class:`Rotation`, :class:`SimulatorPool`):

    single       one frozen, collapsed LLM (gamma-sharpened, ignores its persona)
    rotation     three such LLMs, one per GRPO group (round robin)
    vs_prob      Verbalized Sampling over the single LLM, candidates drawn by stated probability
    vs_random    the same, drawn uniformly
    cotrain      a trainable simulator, starting as the single LLM, rewarded 1 - r (adversarial)
    population   co-training, but every group faces a member of the snapshot pool
    oracle       (optional, not a default arm) trains on the human model itself: the ceiling a
                 simulator could at best give, as a reference; its "held-out" reward is not held out

Every ``eval_every`` steps the policy plays each held-out simulator (fixed seeds: all arms and
steps see the same users); the run reports reward against its training simulator, held-out
reward and policy entropy, each as a mean over seeds with a 95% t-interval.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from scope_marl.envs.lab.episodes import Dialogues, play
from scope_marl.envs.lab.game import Game
from scope_marl.envs.lab.panel import HELDOUT_PANEL, build_panel, load_panel
from scope_marl.envs.lab.policy import StrategyPolicy
from scope_marl.envs.lab.simulators import (
    FrozenActs,
    PopulationActs,
    TrainableActs,
    VerbalizedActs,
    entropy_nats,
)
from scope_marl.simulators.base import Simulator
from scope_marl.simulators.pool import SimulatorPool
from scope_marl.simulators.rotation import Rotation
from scope_marl.training.losses import group_advantages, policy_loss

ARMS = ("single", "rotation", "vs_prob", "vs_random", "cotrain", "population")
OPTIONAL_ARMS = ("oracle",)
GAMES = ("theory", "p4g")
METRICS = ("train_reward", "heldout_reward", "policy_entropy")
EVAL_SEED = 10_007  # evaluation users are the same for every arm, seed and step (common random numbers)


@dataclass(frozen=True)
class Settings:
    """Hyperparameters of one game. The optimizer and co-training values were chosen on the
    VALIDATION panel with ``python -m scope_marl.envs.lab.tune`` (docs/lab.md); the simulator
    model (gammas, adherence, VS) is an assumption of the lab, fixed a priori and never tuned."""

    steps: int = 150
    groups: int = 8  # tasks (personas) per step, one GRPO group each
    group_size: int = 8
    lr: float = 0.1  # Adam on the agent's logits
    kl_coef: float = 0.01  # k3 KL to the initial (uniform) policy, the release's value
    sim_lr: float = 0.3  # Adam on the trainable simulator's logits
    sim_kl_coef: float = 0.5  # k3 KL of the trainable simulator to its initial distribution
    pool_every: int = 5  # a pool snapshot every N steps (release: 16, in runs of hundreds of steps)
    pool_size: int = 10  # release default
    eval_every: int = 15
    eval_groups: int = 64  # per held-out simulator
    eval_group_size: int = 8
    train_gamma: float = 4.0  # the training LLM's collapse
    train_adherence: float = 0.0  # ... and it ignores the persona it is given
    rotation: tuple[tuple[float, float], ...] = ((4.0, 0.0), (3.0, 0.2), (6.0, 0.1))  # (gamma, adherence) of K = 3 LLMs


# lr, sim_lr, sim_kl_coef and pool_every as chosen by ``python -m scope_marl.envs.lab.tune`` on the
# validation panel (5 seeds, 100-104; scores in docs/lab.md).
SETTINGS = {
    "theory": Settings(lr=0.1, sim_lr=0.3, sim_kl_coef=0.5, pool_every=5),  # = the defaults above
    "p4g": Settings(steps=120, eval_every=20, eval_groups=48, lr=0.3, sim_lr=0.1, sim_kl_coef=2.0, pool_every=15),
}


def load_game(name: str) -> Game:
    if name == "theory":
        from scope_marl.envs.lab.theory import theory_game

        return theory_game()
    if name == "p4g":
        from scope_marl.envs.lab.p4g import p4g_game

        return p4g_game()
    raise ValueError(f"unknown lab game {name!r}; use one of {list(GAMES)}")


# ---- what each arm trains against ------------------------------------------------------------


@dataclass
class Opponent:
    simulator: Simulator  # what play() asks for_group(...)
    trainable: TrainableActs | None = None  # updated on its own turns (cotrain, population)
    pool: SimulatorPool | None = None


def opponent(arm: str, game: Game, s: Settings, seed: int, workdir: Path) -> Opponent:
    llm = FrozenActs.sharpened(game, s.train_gamma, s.train_adherence, simulator_id="train-llm")
    if arm == "single":
        return Opponent(llm)
    if arm == "oracle":
        return Opponent(FrozenActs.sharpened(game, 1.0, 1.0, simulator_id="human"))
    if arm == "rotation":
        members = [FrozenActs.sharpened(game, g, a, simulator_id=f"llm-{i}") for i, (g, a) in enumerate(s.rotation)]
        return Opponent(Rotation(members, order="round_robin", seed=seed))
    if arm in ("vs_prob", "vs_random"):
        return Opponent(VerbalizedActs(llm, method=arm.removeprefix("vs_")))
    if arm == "cotrain":
        trainable = TrainableActs(llm)
        return Opponent(trainable, trainable)
    if arm == "population":
        trainable = TrainableActs(llm)
        pool = SimulatorPool(workdir / "pool", max_size=s.pool_size, selection="random", seed=seed)
        pool.add(trainable.save(workdir / "staging"), step=0, base=True)
        return Opponent(PopulationActs(pool, game, trainable.adherence, seed), trainable, pool)
    raise ValueError(f"unknown arm {arm!r}; use any of {list(ARMS + OPTIONAL_ARMS)}")


# ---- updates (the shared GRPO loss on lab tensors) ----------------------------------------------


def update_agent(policy: StrategyPolicy, optimizer: torch.optim.Optimizer, d: Dialogues, s: Settings) -> dict:
    """One GRPO step of the agent: each episode is a stream of its strategy choices."""
    advantages = group_advantages(d.rewards, d.group_ids)
    turn = torch.arange(d.strategies.shape[1]).expand_as(d.strategies)
    logp = policy(turn, d.previous)  # [n, T, S]
    new = logp.gather(-1, d.strategies[..., None]).squeeze(-1)
    reference = torch.full_like(new, -math.log(logp.shape[-1]))  # the initial policy is uniform
    loss, stats = policy_loss(new, d.agent_logp, advantages, d.mask.float(), ref_logp=reference,
                              entropy=entropy_nats(logp.exp()), kl_coef=s.kl_coef)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    # One update per batch: the recomputed log-probs equal the sampled ones (on-policy exactness).
    stats["on_policy_gap"] = float((new.detach() - d.agent_logp)[d.mask].abs().max())
    return stats


def update_simulator(simulator: TrainableActs, optimizer: torch.optim.Optimizer, d: Dialogues, s: Settings) -> dict:
    """One GRPO step of the trainable user on its own turns, rewarded 1 - r (adversarial, as in P4G).

    Under population co-training the turns were played by pool members: ``d.user_logp`` is then the
    member's log-prob and the clipped ratio corrects for the difference, as in PPO.
    """
    advantages = group_advantages(1.0 - d.rewards, d.group_ids)
    played = d.played[:, None].expand_as(d.acts)
    new, reference = simulator.log_probs(played, d.previous, d.strategies, d.acts)
    loss, stats = policy_loss(new, d.user_logp, advantages, d.mask.float(), ref_logp=reference, kl_coef=s.sim_kl_coef)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return stats


# ---- evaluation ---------------------------------------------------------------------------------


def evaluate(game: Game, policy: StrategyPolicy, panel: list, s: Settings) -> dict:
    """Mean reward and policy entropy against each panel member, then their means over the panel."""
    per_simulator, entropies = {}, []
    for index, (name, simulator, weights) in enumerate(panel):
        generator = torch.Generator().manual_seed(EVAL_SEED + index)
        personas = torch.multinomial(weights, s.eval_groups, replacement=True, generator=generator)
        d = play(game, policy, simulator, personas, s.eval_group_size, generator)
        per_simulator[name] = float(d.rewards.mean())
        entropies.append(d.mean_entropy())
    return {"reward": sum(per_simulator.values()) / len(per_simulator), "entropy": sum(entropies) / len(entropies),
            "per_simulator": per_simulator}


# ---- one run -----------------------------------------------------------------------------------


def train_arm(game: Game, arm: str, seed: int, s: Settings, panel: list) -> dict:
    """Train one arm with one seed; returns its curve (every ``eval_every`` steps) and final point."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    policy = StrategyPolicy(game)
    optimizer = torch.optim.Adam(policy.parameters(), lr=s.lr)
    curve, rewards, gaps = [], [], []
    with tempfile.TemporaryDirectory(prefix="scope-lab-") as tmp:
        opp = opponent(arm, game, s, seed, Path(tmp))
        sim_optimizer = torch.optim.Adam([opp.trainable.logits], lr=s.sim_lr) if opp.trainable else None

        def point(step: int) -> None:
            held_out = evaluate(game, policy, panel, s)
            window = rewards[-s.eval_every:] if step else rewards[:1]
            curve.append({"step": step, "train_reward": sum(window) / len(window), "heldout_reward": held_out["reward"],
                          "policy_entropy": held_out["entropy"], "per_simulator": held_out["per_simulator"]})

        for step in range(s.steps):
            personas = torch.multinomial(game.weights, s.groups, replacement=True, generator=generator)
            d = play(game, policy, opp.simulator, personas, s.group_size, generator, first_group=step * s.groups)
            rewards.append(float(d.rewards.mean()))
            if step == 0:
                point(0)
            gaps.append(update_agent(policy, optimizer, d, s)["on_policy_gap"])
            if opp.trainable is not None:
                update_simulator(opp.trainable, sim_optimizer, d, s)
            if opp.pool is not None and (step + 1) % s.pool_every == 0:
                opp.pool.add(opp.trainable.save(Path(tmp) / f"staging-{step + 1}"), step=step + 1)
            if (step + 1) % s.eval_every == 0 or step + 1 == s.steps:
                point(step + 1)
    return {"arm": arm, "seed": seed, "curve": curve, "final": curve[-1], "start": curve[0],
            "max_on_policy_gap": max(gaps), "policy": policy.describe(game)}


# ---- over seeds ---------------------------------------------------------------------------------

# Two-sided 95% Student-t quantiles by degrees of freedom (1..30); beyond, the normal 1.96.
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def interval(values: list[float]) -> dict:
    """Mean and 95% t-interval over seeds (with few seeds a t-interval is honest; a bootstrap is too narrow)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return {"mean": mean, "low": mean, "high": mean, "n": n}
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = (_T975[n - 2] if n - 1 <= len(_T975) else 1.96) * sd / math.sqrt(n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n}


def summarize(runs: list[dict]) -> dict:
    """Per metric: the final value, its change since step 0, both over seeds; the mean curve with bands."""
    out: dict = {"final": {}, "change": {}}
    for key in METRICS:
        out["final"][key] = interval([r["final"][key] for r in runs])
        out["change"][key] = interval([r["final"][key] - r["start"][key] for r in runs])
    names = runs[0]["final"]["per_simulator"]
    out["per_simulator"] = {name: interval([r["final"]["per_simulator"][name] for r in runs]) for name in names}
    curve = []
    for i, p in enumerate(runs[0]["curve"]):
        point = {"step": p["step"]}
        for key in METRICS:
            stats = interval([r["curve"][i][key] for r in runs])
            point.update({key: stats["mean"], f"{key}_low": stats["low"], f"{key}_high": stats["high"]})
        curve.append(point)
    out["curve"] = curve
    return out


# ---- the lab ------------------------------------------------------------------------------------


def run_lab(game: str = "theory", arms: list[str] | None = None, seeds: int = 5, panel: str | Path | None = None,
            out: Path = Path("lab"), log: Callable[[str], None] = print) -> dict:
    """Train every arm with ``seeds`` seeds on ``game`` and write results.json, report.md, collapse.png to ``out``.

    ``panel`` is a held-out panel YAML (default: panel_default.yaml beside this module). Returns the
    results dict that :func:`format_table` prints.
    """
    started = time.perf_counter()
    arms = list(arms or ARMS)
    unknown = [a for a in arms if a not in ARMS + OPTIONAL_ARMS]
    if unknown:
        raise ValueError(f"unknown arm(s) {unknown}; choose from {list(ARMS + OPTIONAL_ARMS)}")
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    lab_game = load_game(game)
    s = SETTINGS[game]
    panel_path = Path(panel) if panel is not None else HELDOUT_PANEL
    panel_spec = load_panel(panel_path)
    members = build_panel(lab_game, panel_spec)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads cost more than they give, and runs are comparable
    try:
        per_arm = {}
        for arm in arms:
            runs = []
            for seed in range(seeds):
                t0 = time.perf_counter()
                run = train_arm(lab_game, arm, seed, s, members)
                runs.append(run)
                f = run["final"]
                log(f"[lab {game}] {arm:10s} seed {seed}: train {f['train_reward']:.3f}  held-out {f['heldout_reward']:.3f}  "
                    f"entropy {f['policy_entropy']:.3f}  ({time.perf_counter() - t0:.1f}s)")
            per_arm[arm] = {"summary": summarize(runs), "runs": runs}
    finally:
        torch.set_num_threads(threads)

    if "single" in per_arm:
        base = {r["seed"]: r["final"]["heldout_reward"] for r in per_arm["single"]["runs"]}
        for arm, result in per_arm.items():
            diffs = [r["final"]["heldout_reward"] - base[r["seed"]] for r in result["runs"] if r["seed"] in base]
            result["summary"]["heldout_vs_single"] = interval(diffs) if arm != "single" else None
    results = {
        "game": game, "arms": arms, "seeds": seeds, "settings": asdict(s), "panel": panel_spec.model_dump(),
        # The built-in panel is named by its package path, not this machine's absolute path.
        "panel_file": "scope_marl/envs/lab/" + HELDOUT_PANEL.name if panel is None else str(panel_path), "game_notes": lab_game.notes,
        "interval": "95% Student-t interval over seeds",
        "results": {arm: r["summary"] for arm, r in per_arm.items()},
        "runs": {arm: [{k: v for k, v in run.items() if k != "curve"} for run in r["runs"]] for arm, r in per_arm.items()},
        "seconds": time.perf_counter() - started,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "report.md").write_text(report_markdown(results))
    try:
        from scope_marl.evaluation.report import plot_collapse

        plot_collapse({arm: r["curve"] for arm, r in results["results"].items()}, out / "collapse.png",
                      title=f"Collapse lab: {game} ({seeds} seeds, 95% t-intervals)")
    except ImportError as exc:  # matplotlib missing: the tables still stand
        log(f"[lab] no plot: {exc}")
    results["seconds"] = time.perf_counter() - started
    return results


# ---- tables -------------------------------------------------------------------------------------


def _ci(stats: dict | None, signed: bool = False) -> str:
    if stats is None:
        return "-"
    fmt = "{:+.3f}" if signed else "{:.3f}"
    return f"{fmt.format(stats['mean'])} [{fmt.format(stats['low'])}, {fmt.format(stats['high'])}]"


def table_rows(results: dict) -> list[list[str]]:
    rows = []
    for arm, r in results["results"].items():
        final, change = r["final"], r["change"]
        rows.append([arm, _ci(final["train_reward"]), _ci(change["train_reward"], True), _ci(final["heldout_reward"]),
                     _ci(change["heldout_reward"], True), _ci(final["policy_entropy"]), _ci(change["policy_entropy"], True),
                     _ci(r.get("heldout_vs_single"), True)])
    return rows


HEADER = ["arm", "train reward", "change", "held-out reward", "change", "policy entropy", "change", "held-out - single"]


def _verdict(stats: dict, up: str, down: str) -> str:
    if stats["low"] > 0:
        return up
    if stats["high"] < 0:
        return down
    return "no clear change (interval spans 0)"


def checks(results: dict) -> list[str]:
    """The paper's claims, read off the intervals: does single-simulator RL collapse, and which arms beat it?"""
    r = results["results"]
    lines = []
    if "single" in r:
        change = r["single"]["change"]
        lines.append(f"single: training-simulator reward {_ci(change['train_reward'], True)}: "
                     + _verdict(change["train_reward"], "rises", "falls"))
        lines.append(f"single: held-out reward {_ci(change['heldout_reward'], True)}: "
                     + _verdict(change["heldout_reward"], "rises", "falls"))
        lines.append(f"single: policy entropy {_ci(change['policy_entropy'], True)}: "
                     + _verdict(change["policy_entropy"], "rises", "falls"))
        for arm, stats in r.items():
            if arm != "single" and stats.get("heldout_vs_single"):
                diff = stats["heldout_vs_single"]
                note = " (reference only: oracle trains on the human model)" if arm == "oracle" else ""
                lines.append(f"{arm} vs single, held-out {_ci(diff, True)}: "
                             + _verdict(diff, "beats single", "worse than single") + note)
    return lines


def format_table(results: dict) -> str:
    """The per-arm table as plain text, then the checks (what ``scope lab`` prints)."""
    rows = [HEADER, *table_rows(results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = [(f"game {results['game']}: {results['seeds']} seeds, mean [95% t-interval over seeds]; "
              f"held-out panel '{results['panel']['name']}' ({len(results['panel']['simulators'])} simulators); "
              "change = final - step 0")]
    for i, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines + [""] + checks(results))


def report_markdown(results: dict) -> str:
    game = results["game"]
    lines = [f"# Collapse lab: `{game}`", "",
             (f"{results['seeds']} seeds per arm; every cell is the mean over seeds with its {results['interval']}. "
              f"Held-out panel: `{results['panel_file']}` ({len(results['panel']['simulators'])} simulators, never used to "
              "choose anything). *change* is final minus step 0; *held-out - single* is paired by seed."), "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    names = [s["id"] for s in results["panel"]["simulators"]]
    lines += ["", "## Final held-out reward per simulator", "", "| arm | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for arm, r in results["results"].items():
        lines.append(f"| {arm} | " + " | ".join(_ci(r["per_simulator"][n]) for n in names) + " |")
    lines += ["", "## Checks", ""] + [f"- {line}" for line in checks(results)]
    lines += ["", "## Settings", ""] + [f"- `{key}`: {json.dumps(value)}" for key, value in results["settings"].items()]
    lines += ["", "Collapse curves: `collapse.png` (training-simulator reward, held-out reward, policy entropy vs step).",
              "Modelling choices: docs/lab.md.", ""]
    return "\n".join(lines)


def with_settings(game: str, **overrides) -> Settings:
    """The game's settings with some fields replaced (for tuning and tests)."""
    return replace(SETTINGS[game], **overrides)
