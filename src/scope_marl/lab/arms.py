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

from dataclasses import dataclass
from pathlib import Path

from pydantic import ConfigDict, Field

from scope_marl.config import Section
from scope_marl.lab.games import Game
from scope_marl.lab.simulators import FrozenActs, PopulationActs, TrainableActs, VerbalizedActs
from scope_marl.simulators.base import Simulator
from scope_marl.simulators.pool import SimulatorPool
from scope_marl.simulators.rotation import Rotation

ARMS = ("single", "rotation", "vs_prob", "vs_random", "cotrain", "population")
OPTIONAL_ARMS = ("oracle",)


class Settings(Section):
    """Hyperparameters of one game. The optimizer and co-training values were chosen on the
    VALIDATION panel with ``python -m scope_marl.lab.tune`` (docs/lab.md); the simulator
    model (gammas, adherence, VS) is an assumption of the lab, fixed a priori and never tuned."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(150, ge=1)
    groups: int = Field(8, ge=1, description="tasks (personas) per step, one GRPO group each")
    group_size: int = Field(8, ge=1)
    # the agent's update
    lr: float = Field(0.1, gt=0, description="Adam on the agent's logits")
    kl_coef: float = Field(0.01, ge=0, description="k3 KL to the initial (uniform) policy, the release's value")
    # the trainable simulator's update and its snapshot pool
    sim_lr: float = Field(0.3, gt=0, description="Adam on the trainable simulator's logits")
    sim_kl_coef: float = Field(0.5, ge=0, description="k3 KL of the trainable simulator to its initial distribution")
    pool_every: int = Field(5, ge=1, description="a pool snapshot every N steps (release: 16, in runs of hundreds of steps)")
    pool_size: int = Field(10, ge=2)  # the release's default
    # held-out evaluation
    eval_every: int = Field(15, ge=1)
    eval_groups: int = Field(64, ge=1, description="per held-out simulator")
    eval_group_size: int = Field(8, ge=1)
    # the simulators: an assumption of the lab, never tuned
    train_gamma: float = Field(4.0, gt=0, description="the training LLM's collapse")
    train_adherence: float = Field(0.0, ge=0, le=1, description="... and it ignores the persona it is given")
    rotation: tuple[tuple[float, float], ...] = Field(((4.0, 0.0), (3.0, 0.2), (6.0, 0.1)), description="(gamma, adherence) of K = 3 LLMs")

    def replace(self, **overrides) -> Settings:
        """A copy with some fields replaced, validated like the original."""
        return type(self).model_validate({**self.model_dump(), **overrides})


# lr, sim_lr, sim_kl_coef and pool_every as chosen by ``python -m scope_marl.lab.tune`` on the
# validation panel (5 seeds, 100-104; scores in docs/lab.md).
SETTINGS = {
    "theory": Settings(lr=0.1, sim_lr=0.3, sim_kl_coef=0.5, pool_every=5),  # = the defaults above
    "p4g": Settings(steps=120, eval_every=20, eval_groups=48, lr=0.3, sim_lr=0.1, sim_kl_coef=2.0, pool_every=15),
}


class LLMSettings(Settings):
    """The LLM-policy lab (``scope lab --policy llm``): the agent is a language model with a LoRA
    adapter; the simulators and their settings (gammas, co-training, pool) are the tabular lab's.

    Sized for a 2-core CPU: every step plays ``groups x group_size`` dialogues of up to three
    messages of at most ``max_new_tokens`` tokens, and every evaluation point plays
    ``eval_groups x eval_group_size`` dialogues against each of the six held-out simulators.
    """

    steps: int = Field(12, ge=1)
    groups: int = Field(4, ge=1)
    group_size: int = Field(4, ge=1)
    lr: float = Field(2e-3, gt=0, description="AdamW on the agent's LoRA adapter")
    kl_coef: float = Field(
        0.0, ge=0, description="k3 KL to the model with adapters off (the base, or the warm-started policy); 0 skips the reference forward"
    )
    warm_start: bool = Field(
        False, description="start every arm from the game's warm-started agent (lab/warm_start.py): scope sft on its strategy messages"
    )
    warm_start_lr: float = Field(2e-3, gt=0, description="the warm start's SFT learning rate (LoRA r 16, merged afterwards)")
    warm_start_epochs: float = Field(3.0, gt=0, description="passes of the warm start's SFT over its training messages")
    eval_every: int = Field(6, ge=1)
    eval_groups: int = Field(2, ge=1, description="per held-out simulator")
    eval_group_size: int = Field(4, ge=1)
    lora_r: int = Field(8, ge=1)
    lora_alpha: int = Field(16, ge=1)
    max_new_tokens: int = Field(32, ge=1, le=256)
    temperature: float = Field(0.7, gt=0, description="the agent's sampling temperature (its log-probs are exact at it)")


# The full LLM setting (bench/collapse_llm.py) and the quick one a test and the demo can afford. The theory
# game's is the second run's (docs/lab.md): the warm-started agent, anchored to it with the KL coefficient
# bench/lab_kl_select.py chose on the validation panel (0.05: 0.01 let distinct-2 fall to 0.52 of step 0).
LLM_SETTINGS = {
    "theory": LLMSettings(warm_start=True, kl_coef=0.05),
    "p4g": LLMSettings(**SETTINGS["p4g"].model_dump(include={"sim_lr", "sim_kl_coef", "pool_every"})),
}
LLM_QUICK = {"steps": 4, "groups": 2, "group_size": 4, "eval_every": 2, "eval_groups": 1, "eval_group_size": 2}


def with_settings(game: str, **overrides) -> Settings:
    """The game's settings with some fields replaced (for tuning and tests)."""
    return SETTINGS[game].replace(**overrides)


@dataclass
class Opponent:
    simulator: Simulator  # what play() asks for_group(...)
    trainable: TrainableActs | None = None  # updated on its own turns (cotrain, population)
    pool: SimulatorPool | None = None


def opponent(arm: str, game: Game, s: Settings, seed: int, workdir: Path, resume_step: int | None = None) -> Opponent:
    """What ``arm`` trains against. ``resume_step``: reopen the snapshot pool in ``workdir`` as it was
    at that step (members added after it are dropped: they belong to a step that is played again)."""
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
        if resume_step is not None:
            pool = SimulatorPool.load(workdir / "pool")
            pool.rewind(resume_step)
        else:
            pool = SimulatorPool(workdir / "pool", max_size=s.pool_size, selection="random", seed=seed)
            pool.add(trainable.save(workdir / "staging"), step=0, base=True)
        return Opponent(PopulationActs(pool, game, trainable.adherence, seed), trainable, pool)
    raise ValueError(f"unknown arm {arm!r}; use any of {list(ARMS + OPTIONAL_ARMS)}")
