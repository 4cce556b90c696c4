"""What each arm of the collapse lab trains against, and the lab's hyperparameters per game.

    single       one frozen, collapsed LLM (gamma-sharpened, ignores its persona)
    rotation     three such LLMs, one per GRPO group (round robin)
    vs_prob      Verbalized Sampling over the single LLM, candidates drawn by stated probability
    vs_random    the same, drawn uniformly
    cotrain      a trainable simulator, starting as the single LLM, rewarded 1 - r (adversarial)
    population   co-training, but every group faces a member of the snapshot pool
    oracle       (optional, not a default arm) trains on the human model itself: the ceiling a
                 simulator could at best give, as a reference; its "held-out" reward is not held out

Every arm is built from the *shared* simulator classes (:class:`Rotation`, :class:`SimulatorPool`)
of the LLM path.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from scope_marl.lab.games import Game
from scope_marl.lab.simulators import FrozenActs, PopulationActs, TrainableActs, VerbalizedActs
from scope_marl.simulators.base import Simulator
from scope_marl.simulators.pool import SimulatorPool
from scope_marl.simulators.rotation import Rotation

ARMS = ("single", "rotation", "vs_prob", "vs_random", "cotrain", "population")
OPTIONAL_ARMS = ("oracle",)


@dataclass(frozen=True)
class Settings:
    """Hyperparameters of one game. The optimizer and co-training values were chosen on the
    VALIDATION panel with ``python -m scope_marl.lab.tune`` (docs/lab.md); the simulator
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


# lr, sim_lr, sim_kl_coef and pool_every as chosen by ``python -m scope_marl.lab.tune`` on the
# validation panel (5 seeds, 100-104; scores in docs/lab.md).
SETTINGS = {
    "theory": Settings(lr=0.1, sim_lr=0.3, sim_kl_coef=0.5, pool_every=5),  # = the defaults above
    "p4g": Settings(steps=120, eval_every=20, eval_groups=48, lr=0.3, sim_lr=0.1, sim_kl_coef=2.0, pool_every=15),
}


def with_settings(game: str, **overrides) -> Settings:
    """The game's settings with some fields replaced (for tuning and tests)."""
    return replace(SETTINGS[game], **overrides)


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
