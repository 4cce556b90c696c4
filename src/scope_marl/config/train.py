"""``scope train`` configs: the learner, LoRA, evaluation, pool and run settings of one experiment arm."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from scope_marl.config.env import EnvConfig, SayTheWordConfig, Split
from scope_marl.config.hardware import HardwareSettings
from scope_marl.config.loading import Section, removed_field
from scope_marl.config.rollout import RaySettings, RolloutConfig
from scope_marl.config.simulator import FrozenSimulatorConfig, SimulatorConfig, default_sampling
from scope_marl.core.types import EpisodeStatus, SamplingParams

Aggregation = Literal["seq_mean_token_mean", "token_mean", "dr_grpo"]
"""Loss aggregations; each is registered under its name in ``training.losses.LOSS_AGGREGATIONS``."""
Baseline = Literal["group", "batch", "group_else_batch"]
"""Advantage baselines; each is registered under its name in ``training.losses.ADVANTAGES``."""


def _constant_groups_fix(section: dict) -> str:
    """How to rewrite a learner section that still sets the removed ``constant_groups``."""
    value = section["constant_groups"]
    if value == "batch" and section.get("baseline", "group") == "batch":
        return "remove `constant_groups: batch`: `baseline: batch` already compares every group with the batch"
    if value == "batch":
        return "replace `constant_groups: batch` with `baseline: group_else_batch` (same advantages)"
    if value == "zero":
        return (
            "remove `constant_groups: zero` (the default `baseline: group` gives equal-reward groups zero advantage, as before; "
            "a run directory's own config.yaml is read with it: scope train --resume upgrades it)"
        )
    return "`constant_groups: batch` is now `baseline: group_else_batch`; `constant_groups: zero` is the default: remove it"


def upgrade_saved(data: dict) -> dict:
    """A run's own saved config from an older release, in today's terms with the same meaning: every run
    directory written before ``constant_groups`` was folded into ``baseline`` holds that key (its default was
    saved too), and resuming or evaluating such a run should not fail on it. A config a user writes gets
    the error instead (:func:`_constant_groups_fix`)."""
    for key in ("learner", "simulator_learner"):
        section = data.get(key)
        if isinstance(section, dict) and "constant_groups" in section:
            section = dict(section)
            if section.pop("constant_groups") == "batch" and section.get("baseline", "group") == "group":
                section["baseline"] = "group_else_batch"
            data = {**data, key: section}
    return data


class LearnerConfig(Section):
    """One role's GRPO learner (``learner:`` for the agent, ``simulator_learner:`` for a trainable simulator)."""

    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    eps_low: float = Field(0.2, ge=0)
    eps_high: float = Field(0.28, ge=0)
    kl_coef: float = Field(0.01, ge=0, description="k3 KL to the base model with adapters disabled")
    entropy_coef: float = Field(0.0, ge=0)
    aggregation: Aggregation = "seq_mean_token_mean"
    normalize_std: bool = Field(False, description="divide each group's advantages by its reward std (+ eps); baseline: batch ignores it")
    baseline: Baseline = Field(
        "group",
        description="what each reward is compared with. group: GRPO's group mean (a group whose rewards are all equal gets zero "
        "advantage); batch: the mean of the batch's group means, for every sample (for rewards that are one number per group); "
        "group_else_batch: the group mean, but a group whose rewards are all equal is compared with the batch's mean of group "
        "means instead of getting zero (formerly constant_groups: batch)",
    )
    token_budget: int = Field(4096, ge=16, description="tokens per micro-batch (gradient accumulation across micro-batches)")
    epochs: int = Field(1, ge=1, description="optimizer epochs over each rollout batch")
    train_on: list[EpisodeStatus] = Field(default_factory=lambda: [EpisodeStatus.COMPLETED])
    old_logprobs: Literal["sampler", "learner"] = Field(
        "sampler",
        description="the ratio's denominator: the log-probs recorded at sampling (exact for local models), or the learner's own "
        "re-scoring of the batch before its first update (for a remote sampler such as a vLLM server, whose log-probs differ in "
        "float detail); the sampler/learner gap is reported either way",
    )
    correction: Literal["none", "tis", "decoupled"] = Field(
        "none",
        description="tokens sampled by an older policy (asynchronous rollouts, a remote sampler): none; tis (the ratio "
        "against the learner's own re-scoring, times min(learner/behaviour, correction_cap)); decoupled (the same, "
        "weight untruncated: AReaL's decoupled PPO). Formulas in docs/formats.md",
    )
    correction_cap: float = Field(2.0, gt=0, description="tis: the importance weight's truncation c")
    gradient_checkpointing: bool = Field(
        False, description="recompute each layer's activations in the backward instead of keeping them (less memory, ~1/3 more compute)"
    )

    @model_validator(mode="before")
    @classmethod
    def _constant_groups_was_folded_into_baseline(cls, data: object) -> object:
        if isinstance(data, dict) and "constant_groups" in data:
            raise removed_field("constant_groups", f"folded into `baseline`; {_constant_groups_fix(data)}")
        return data


THREADS = (
    "torch threads, fixed (for number-for-number reproducible runs); default: the cores this process may use "
    "less those other processes keep busy, checked every step, so two jobs on one machine do not collapse"
)  # scope train's and scope sft's `threads`


class LoraSettings(Section):
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


class EvalSettings(Section):
    every: int = Field(0, ge=0, description="evaluate every N steps (0: never)")
    tasks: int = Field(4, ge=1, description="test tasks per simulator: a fixed, seeded subset of the test split")
    group_size: int = Field(1, ge=1, description="samples per task")
    split: Split = Field("test", description="test (default) or validation: the best checkpoint is chosen on this split")
    panel: str | None = Field(None, description="a panel YAML path or built-in name (offline, api); replaces `simulator`")
    simulator: SimulatorConfig = Field(
        default_factory=lambda: FrozenSimulatorConfig(
            id="heldout-skeptic",
            prompt_prefix="You are skeptical and careful with money.",
            sampling=SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=48),
        ),
        description="the one held-out simulator when no panel is given",
    )


class PoolSettings(Section):
    every: int = Field(16, ge=1, description="snapshot the trainable simulator every N steps")
    max_size: int = Field(10, ge=2)
    selection: Literal["random", "latest", "prioritized"] = "random"


Tracker = Literal["tensorboard", "wandb"]
"""Where a run's metrics are mirrored; each is registered under its name in ``training.trackers.TRACKERS``."""


class WandbSettings(Section):
    """The Weights & Biases run a ``scope train`` run logs to (``logging.trackers: [wandb]``)."""

    project: str = Field("scope-marl", min_length=1)
    entity: str | None = Field(None, description="team or user (default: the API key's own)")
    name: str | None = Field(None, description="the W&B run's display name (default: the run directory's name)")
    tags: list[str] = Field(default_factory=list)
    mode: Literal["auto", "online", "offline"] = Field(
        "auto", description="auto: online when an API key is set (WANDB_API_KEY or wandb login), else offline (said at start)"
    )
    samples_per_step: int = Field(3, ge=0, description="dialogues logged each step as a table (0: none)")


class LoggingSettings(Section):
    trackers: list[Tracker] = Field(
        default_factory=list,
        description="mirrors of metrics.jsonl (which stays the record): tensorboard, wandb (pip install 'scope-marl[wandb]')",
    )
    wandb: WandbSettings = Field(default_factory=WandbSettings)


class TrainerSettings(Section):
    """How rollouts and updates take turns (docs/async.md)."""

    mode: Literal["sync", "async"] = Field(
        "sync",
        description="sync: play a batch, then update on it; async: a generator process plays the next batches with the newest "
        "weights it holds while the learners update (pair with learner.correction)",
    )
    max_staleness: int = Field(
        1,
        ge=0,
        description="async: a batch is trained at most this many policy versions after the weights that played it (0: the sync loop)",
    )
    generator_threads: int = Field(1, ge=1, description="async: torch threads of the generator process")


class TrainConfig(Section):
    """``scope train``: one experiment arm."""

    upgrade_saved: ClassVar = staticmethod(upgrade_saved)

    model: str = Field("embedded", description="the base model every LoRA adapter sits on (a local model spec)")
    sampler: str | None = Field(
        None,
        description="a server that plays every seat on `model` during rollouts (vllm:MODEL@URL serving the same weights); the "
        "learners train on the local copy and push each updated adapter to it by version",
    )
    env: EnvConfig = Field(default_factory=SayTheWordConfig)
    agent_sampling: SamplingParams = Field(default_factory=default_sampling)
    simulator: SimulatorConfig = Field(default_factory=FrozenSimulatorConfig)
    trainable_roles: list[Literal["agent", "user"]] = Field(default_factory=lambda: ["agent"], min_length=1)
    finetune: Literal["lora", "full"] = Field("lora", description="the agent as a LoRA adapter, or every weight of its own copy")
    lora: LoraSettings = Field(default_factory=LoraSettings)
    learner: LearnerConfig = Field(default_factory=LearnerConfig, description="the agent's learner")
    simulator_learner: LearnerConfig | None = Field(None, description="the trainable simulator's learner (default: as the agent)")
    rollout: RolloutConfig = Field(default_factory=lambda: RolloutConfig(group_size=4, max_concurrent=32))
    tasks_per_step: int = Field(4, ge=1)
    task_ids: list[str] | None = Field(
        None, description="train on these tasks of the train split only (default: all of it), e.g. a curriculum's subset"
    )
    steps: int = Field(10, ge=1)
    eval: EvalSettings = Field(default_factory=EvalSettings)
    checkpoint_every: int = Field(5, ge=1)
    keep_last: int = Field(2, ge=1)
    pool: PoolSettings | None = Field(None, description="population co-training: snapshots of the trainable simulator")
    seed: int = 0
    threads: int | None = Field(None, ge=1, description=THREADS)
    hardware: HardwareSettings = Field(default_factory=HardwareSettings, description="device, precision and torchrun sharding")
    deterministic: bool = Field(False, description="torch.use_deterministic_algorithms, for number-for-number resumes")
    tensorboard: bool = Field(
        False,
        description="also write every metric to RUN_DIR/tensorboard (pip install 'scope-marl[tensorboard]'); same as logging.trackers: [tensorboard]",
    )
    logging: LoggingSettings = Field(default_factory=LoggingSettings, description="trackers: TensorBoard, Weights & Biases")
    executor: Literal["local", "ray"] = Field("local", description="rollouts in this process, or on Ray rollout workers (the ray extra)")
    trainer: TrainerSettings = Field(default_factory=TrainerSettings, description="sync or async rollouts (docs/async.md)")
    ray: RaySettings = Field(default_factory=RaySettings)

    @property
    def trackers(self) -> list[str]:
        """The trackers this run writes to (``tensorboard: true`` counts as ``tensorboard``), each once."""
        return list(dict.fromkeys([*(["tensorboard"] if self.tensorboard else []), *self.logging.trackers]))

    @model_validator(mode="after")
    def _roles_match_simulator(self) -> TrainConfig:
        if "user" in self.trainable_roles and self.simulator.mode != "trainable":
            raise ValueError(
                f"trainable_roles includes 'user' but simulator.mode is {self.simulator.mode!r}; use mode: trainable (co-training)"
            )
        if self.simulator.mode == "trainable" and "user" not in self.trainable_roles:
            raise ValueError("simulator.mode is 'trainable' but 'user' is not in trainable_roles; add it, or use mode: frozen")
        if self.sampler is not None and self.executor == "ray":
            raise ValueError("sampler: Ray rollout workers do not receive the sampler's adapters yet; use executor: local with a sampler")
        if self.trainer.mode == "async" and self.finetune == "full":
            raise ValueError(
                "trainer.mode: async plays ahead on a generator process, Ray workers or a sampler server that receive LoRA "
                "adapters; it does not work with finetune: full: use trainer.mode: sync for it"
            )
        if self.sampler is not None and self.finetune == "full":
            raise ValueError("sampler: a server receives LoRA adapters, not whole weights; use finetune: lora with a sampler")
        if self.finetune == "full" and self.trainable_roles != ["agent"]:
            raise ValueError(
                "finetune: full trains the agent only (trainable_roles: [agent]); co-training keeps both roles as LoRA adapters"
            )
        curriculum = getattr(self.env, "simulator_reward", None) == "curriculum"
        if curriculum and "user" in self.trainable_roles and (self.simulator_learner or self.learner).baseline != "batch":
            raise ValueError(
                "env.simulator_reward: curriculum gives every episode of a group the same user reward, so a group baseline "
                "makes each simulator advantage exactly zero; set simulator_learner: {baseline: batch}"
            )
        if self.pool is not None and self.simulator.mode != "trainable":
            raise ValueError("pool (population co-training) needs simulator.mode: trainable")
        if self.executor == "ray" and self.finetune == "full":
            raise ValueError(
                "executor: ray sends the changed adapter tensors to the workers after each update; finetune: full would send "
                "every weight each step, which is not supported: use finetune: lora, or executor: local"
            )
        return self
