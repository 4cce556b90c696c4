"""One arm, one seed of the LLM-policy lab: the agent's GRPO updates by the project's Learner, the
simulators' by the tabular lab's, held-out evaluation, and a checkpoint after every step.

A run's directory is a :class:`~scope_marl.training.run_dir.RunDir` like ``scope train``'s: locked while
it trains, ``metrics.jsonl`` (one line per step), ``checkpoints/step-NNNNNN/`` after every step (the
agent's adapter, both optimizers, the random states and the curve so far; atomic, with a manifest of
hashes, the last two kept), the snapshot pool of population co-training, and ``result.json`` once
finished. A run that stops at any moment (mid-checkpoint too) resumes from its last whole step and
ends as if it had never stopped: every random draw comes from the saved generators or from seeds
derived per step.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch

from scope_marl.backends.hf import HFChatModel
from scope_marl.config.train import LearnerConfig
from scope_marl.core import files, run_layout
from scope_marl.core.seeds import derive_seed
from scope_marl.evaluation.diversity import distinct_n
from scope_marl.lab.arms import LLMSettings, opponent
from scope_marl.lab.classifier import OTHER
from scope_marl.lab.episodes import play
from scope_marl.lab.games import Game
from scope_marl.lab.llm_agent import ROLE, LLMAgent
from scope_marl.lab.loop import EVAL_SEED, update_simulator
from scope_marl.simulators.base import Simulator
from scope_marl.training import checkpoint
from scope_marl.training.learner import Learner
from scope_marl.training.run_dir import RunDir

COMMAND = "scope lab --policy llm"
LEGACY_STATE = "state.pt"  # what releases before the shared run directory wrote
RESULT_FILE = "result.json"
SIMULATOR = "simulator"  # the tabular simulator's optimizer, in a checkpoint's optimizers
KEEP_LAST = 2  # checkpoints kept: the newest, and one to fall back on if it is damaged
EXAMPLES = 4  # example dialogues kept per evaluation point


class Assigned(Simulator):
    """A fixed simulator per group (the evaluation plays every panel member in one batch)."""

    simulator_id = "assigned"

    def __init__(self, members: list[Simulator]):
        self.members = members

    def for_group(self, group_index: int) -> Simulator:
        return self.members[group_index]

    def respond(self, turns):
        raise TypeError("Assigned only hands out its members; ask for_group(i) for the simulator of group i")


def reset_adapter(chat: HFChatModel, s: LLMSettings, seed: int) -> None:
    """A fresh LoRA adapter for the agent (B = 0: the untrained agent is the base model, whatever the seed)."""
    from peft import LoraConfig

    if ROLE in chat.adapters:
        chat.remove_adapter(ROLE)
    torch.manual_seed(seed)
    chat.add_adapter(ROLE, LoraConfig(r=s.lora_r, lora_alpha=s.lora_alpha, lora_dropout=0.0, target_modules="all-linear"))
    chat.prefix_cache.clear()


def strategy_stats(game: Game, labels: list[list[str]]) -> dict:
    """The entropy (nats) of the agent's classified strategies, ``other`` counted as a label, and each label's share."""
    counts = Counter(label for row in labels for label in row)
    total = sum(counts.values())
    names = [*game.strategies, OTHER]
    shares = {name: counts[name] / total if total else 0.0 for name in names}
    entropy = -sum(p * math.log(p) for p in shares.values() if p > 0)
    return {"entropy": entropy, "shares": shares}


def evaluate_llm(agent: LLMAgent, game: Game, panel: list, s: LLMSettings) -> dict:
    """The agent against every held-out simulator, all in one batch of dialogues (common random numbers:
    the same personas and seeds for every arm, seed and step)."""
    personas, members = [], []
    for index, (_, simulator, weights) in enumerate(panel):
        generator = torch.Generator().manual_seed(EVAL_SEED + index)
        personas.append(torch.multinomial(weights, s.eval_groups, replacement=True, generator=generator))
        members += [simulator] * s.eval_groups
    generator = torch.Generator().manual_seed(EVAL_SEED)
    turns = agent.batch(len(members) * s.eval_group_size, seed=EVAL_SEED)
    try:
        d = play(game, turns, Assigned(members), torch.cat(personas), s.eval_group_size, generator, unclear_act=agent.unclear_act)
    finally:
        turns.close()
    per_member = d.rewards.view(len(panel), -1).mean(1).tolist()
    labels = turns.label_names()
    texts = [m for row in turns.messages for m in row]
    strategies = strategy_stats(game, labels)
    return {
        "heldout_reward": sum(per_member) / len(per_member),
        "per_simulator": {name: r for (name, _, _), r in zip(panel, per_member)},
        "strategy_entropy": strategies["entropy"],
        "strategy_shares": strategies["shares"],
        "other_share": strategies["shares"][OTHER],
        "distinct2": distinct_n(texts, 2) or 0.0,
        "message_tokens": turns.tokens / max(1, len(texts)),
        "examples": [{"messages": turns.messages[i], "strategies": labels[i]} for i in range(0, len(members) * s.eval_group_size, 7)][
            :EXAMPLES
        ],
    }


def train_llm_arm(
    chat: HFChatModel,
    game: Game,
    arm: str,
    seed: int,
    s: LLMSettings,
    panel: list,
    workdir: Path,
    start_point: dict,
    progress: Callable[[int, float], None] = lambda step, seconds: None,
) -> dict:
    """Train (or resume) one arm with one seed in ``workdir``; returns its curve and final point.

    ``start_point`` is the untrained agent's evaluation (the same for every arm and seed: a new adapter
    is the base model). ``progress(step, seconds)`` is called after every step with that step's time.
    """
    done = workdir / RESULT_FILE
    if done.exists():
        return json.loads(done.read_text())
    with RunDir(workdir, COMMAND, restart=f"{COMMAND} --out NEW_DIR") as run:  # locked while it trains, like scope train's runs
        return _train(run, chat, game, arm, seed, s, panel, start_point, progress)


def _train(
    run: RunDir, chat: HFChatModel, game: Game, arm: str, seed: int, s: LLMSettings, panel: list, start_point: dict, progress
) -> dict:
    workdir = run.path
    resumed = run.checkpointed_step() > 0
    if (workdir / LEGACY_STATE).exists() and not resumed:
        raise ValueError(
            f"{workdir} holds a {LEGACY_STATE} written by an older release; finish that run with it, or remove {workdir} "
            "to train this arm and seed again"
        )
    reset_adapter(chat, s, seed)
    agent = LLMAgent(chat, game, max_new_tokens=s.max_new_tokens, temperature=s.temperature)
    learner = Learner(chat, ROLE, ROLE, s.temperature, LearnerConfig(lr=s.lr, kl_coef=s.kl_coef))
    generator = torch.Generator().manual_seed(seed)
    state: dict = {}

    def load(path: Path) -> None:
        saved, optimizers, rng = checkpoint.load_state(path)
        chat.load_adapter_weights(ROLE, run_layout.saved_adapter(path, ROLE))
        learner.optimizer.load_state_dict(optimizers[ROLE])
        state.update(saved, optimizers=optimizers, rng=rng)

    if resumed:
        run.load_newest_checkpoint(load, print)
        run.trim_metrics(state["step"], print)
    opp = opponent(arm, game, s, seed, workdir, resume_step=state["step"] if resumed else None)
    sim_optimizer = torch.optim.Adam([opp.trainable.logits], lr=s.sim_lr) if opp.trainable else None
    if resumed:
        checkpoint.restore_rng(state["rng"])
        generator.set_state(state["rng"]["engine"]["generator"])
        if opp.trainable is not None:
            with torch.no_grad():
                opp.trainable.logits.copy_(state["rng"]["engine"]["simulator"])
            sim_optimizer.load_state_dict(state["optimizers"][SIMULATOR])
        curve, rewards, gaps, step0, seconds = state["curve"], state["rewards"], state["gaps"], state["step"], state["seconds"]
    else:
        curve, rewards, gaps, step0, seconds = [{"step": 0, "train_reward": None, **start_point}], [], [], 0, 0.0

    for step in range(step0, s.steps):
        started = time.perf_counter()
        personas = torch.multinomial(game.weights, s.groups, replacement=True, generator=generator)
        turns = agent.batch(s.groups * s.group_size, seed=derive_seed(seed, step))
        try:
            d = play(
                game, turns, opp.simulator, personas, s.group_size, generator, first_group=step * s.groups, unclear_act=agent.unclear_act
            )
        finally:
            turns.close()
        rewards.append(float(d.rewards.mean()))
        if step == 0:
            curve[0]["train_reward"] = rewards[0]
        stats = learner.step(turns.episodes(d.rewards, d.group_ids, d.simulators, s.group_size))
        gaps.append(stats.get("logprob_gap", 0.0))
        if opp.trainable is not None:
            update_simulator(opp.trainable, sim_optimizer, d, s)
        if opp.pool is not None and (step + 1) % s.pool_every == 0:
            opp.pool.add(opp.trainable.save(workdir / f"staging-{step + 1}"), step=step + 1)
        if (step + 1) % s.eval_every == 0 or step + 1 == s.steps:
            window = rewards[-s.eval_every :]
            curve.append({"step": step + 1, "train_reward": sum(window) / len(window), **evaluate_llm(agent, game, panel, s)})
        step_s = time.perf_counter() - started
        seconds += step_s
        run.append_metrics(
            {
                "step": step + 1, "train_reward": rewards[-1], "logprob_gap": gaps[-1], "kl": stats.get("kl", 0.0),
                "update_s": stats.get("update_s", 0.0), "step_s": step_s,
            }
        )  # fmt: skip
        optimizers = {ROLE: learner.optimizer} | ({SIMULATOR: sim_optimizer} if sim_optimizer is not None else {})
        run.save_checkpoint(
            step + 1,
            KEEP_LAST,
            chat=chat,
            adapters=[ROLE],
            optimizers=optimizers,
            state={"curve": curve, "rewards": rewards, "gaps": gaps, "seconds": seconds},
            engine_state={
                "generator": generator.get_state(),
                "simulator": opp.trainable.logits.detach().clone() if opp.trainable is not None else None,
            },
        )
        progress(step + 1, time.perf_counter() - started)

    result = {
        "arm": arm,
        "seed": seed,
        "curve": curve,
        "start": curve[0],
        "final": curve[-1],
        "max_logprob_gap": max(gaps, default=0.0),
        "seconds": seconds,
    }
    files.write_json(workdir / RESULT_FILE, result)
    return result
