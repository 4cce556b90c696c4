"""``scope diagnose gamma``: how collapsed is a simulator? (the paper's gamma-sharpening, measured)

An aligned LLM asked for a user's reply acts like the human reply distribution p sharpened to
p^gamma / Z with gamma > 1: its modal reply takes most of the mass. We measure that directly: for N
dialogue states (a persona from the test split, and a persuader's opening line), draw M replies and
group them by their normalized first sentence (two replies that open the same way are one reply).
Per state we report the top-1 reply mass, the number of unique replies, the entropy of the reply
distribution (nats), and the Zipf slope (least-squares slope of log frequency on log rank; steeper
negative = more collapsed). The same model under Verbalized Sampling gives the reference entropy:
``entropy_ratio = H(simulator) / H(VS)`` below 1 means VS recovers diversity the plain simulator lost.

VS replies are drawn like the rollout draws them: each of ``vs_calls`` calls states k candidates
with probabilities, and each of the M draws picks one call in turn and one candidate by its stated
probability, so both sides use the same plug-in estimator on M draws.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from scope_marl.assembly import ModelCache, build_env, build_simulator
from scope_marl.config import (
    FrozenSimulatorConfig,
    LLMSimulatorFields,
    P4GConfig,
    SayTheWordConfig,
    SimulatorConfig,
    VerbalizedConfig,
    parse_simulator_spec,
)
from scope_marl.core import files
from scope_marl.core.seeds import derive_seed
from scope_marl.core.types import Message
from scope_marl.envs import AGENT, USER, Environment, role_view
from scope_marl.evaluation.diversity import first_sentence
from scope_marl.simulators.base import Response, Simulator, SimulatorTurn
from scope_marl.simulators.candidates import Candidate, draw_candidate

OPENERS = [
    "Hi! Have you heard of the charity Save the Children?",
    "Hello, how are you today? I'd like to tell you about a charity that helps children in need.",
    "Hi there. Would you consider donating some of your task payment to Save the Children?",
    "Good day! Do you usually donate to charities?",
]


def dialogue_states(env: Environment, n: int, seed: int = 0, split: str = "test") -> list[SimulatorTurn]:
    """N user turns to answer: a test persona each, after one persuader opening (when the agent speaks first)."""
    tasks = list(env.tasks(split))
    random.Random(seed).shuffle(tasks)
    if not tasks:
        raise ValueError(f"the environment has no {split} tasks to build dialogue states from")
    states = []
    for i in range(n):
        task = tasks[i % len(tasks)]
        messages = [Message(role=AGENT, content=OPENERS[i % len(OPENERS)])] if env.first_speaker(task) == AGENT else []
        context = role_view(messages, USER, env.system_prompt(task, USER))
        states.append(SimulatorTurn(f"state-{i}", task, context, functools.partial(env.normalize_user_reply, task)))
    return states


def reply_stats(replies: Sequence[str]) -> dict:
    """Top-1 mass, unique count, entropy and Zipf slope of replies grouped by normalized first sentence."""
    counts = sorted(Counter(first_sentence(r) for r in replies).values(), reverse=True)
    total = sum(counts)
    probs = np.array(counts, dtype=float) / total
    if len(counts) >= 2:
        slope = float(np.polyfit(np.log(np.arange(1, len(counts) + 1)), np.log(counts), 1)[0])
    else:
        slope = None  # one reply: no rank curve to fit
    return {
        "samples": total,
        "top1_mass": float(probs[0]),
        "unique": len(counts),
        "entropy": float(-(probs * np.log(probs)).sum()),
        "zipf_slope": slope,
    }


def sample_plain(simulator: Simulator, state: SimulatorTurn, m: int, seed: int, batch: int = 64) -> list[str]:
    """M replies in batches, each batch with its own seed (reproducible, and never the same batch twice)."""
    out: list[str] = []
    seat = getattr(simulator, "seat", None)
    while len(out) < m:
        if seat is not None:
            simulator.seat = dataclasses.replace(seat, sampling=seat.sampling.model_copy(update={"seed": derive_seed(seed, len(out))}))
        replies = simulator.respond([state] * min(batch, m - len(out)))
        out += [str(r.reply if isinstance(r, Response) else r) for r in replies]
    if seat is not None:
        simulator.seat = seat
    return out


def sample_vs(simulator: Simulator, state: SimulatorTurn, m: int, calls: int, seed: int) -> list[str]:
    """M draws spread over ``calls`` VS calls, each draw by the call's stated probabilities."""
    responses = simulator.respond([state] * calls)
    candidate_lists = [r.info.get("candidates") for r in responses if isinstance(r, Response)]
    rng = random.Random(seed)
    out = []
    for j in range(m):
        candidates = candidate_lists[j % len(candidate_lists)] if candidate_lists else None
        if candidates:
            parsed = [Candidate(c["text"], c["probability"]) for c in candidates]
            out.append(parsed[draw_candidate(parsed, rng)].text)
        else:  # the call fell back to its raw text: that text is the reply
            r = responses[j % len(responses)]
            out.append(str(r.reply if isinstance(r, Response) else r))
    return out


def paired_configs(cfg: SimulatorConfig, k: int) -> tuple[SimulatorConfig, VerbalizedConfig]:
    """(the simulator as plain sampling, the same model under VS) for any LLM simulator config."""
    shared = {"model": cfg.model, "sampling": cfg.sampling, "prompt_prefix": cfg.prompt_prefix, "adapter": cfg.adapter}
    if isinstance(cfg, VerbalizedConfig):
        return FrozenSimulatorConfig(**shared), cfg
    return cfg, VerbalizedConfig(mode="vs", k=k, method="prob", **shared)


DIAGNOSIS_ENVS = {  # the environments scope diagnose gamma samples dialogue states from
    "p4g": lambda: P4GConfig(name="p4g", max_exchanges=3, word_limit=30),
    "say_the_word": SayTheWordConfig,
}


def diagnose_spec(spec: str, env: str = "p4g", out=None, log: Callable[[str], None] = print, **settings) -> dict:
    """``scope diagnose gamma``: :func:`diagnose_gamma` of a simulator spec string (e.g. ``frozen:embedded``)
    on one of :data:`DIAGNOSIS_ENVS`; the result also written as JSON to ``out`` when given."""
    if env not in DIAGNOSIS_ENVS:
        raise ValueError(f"unknown --env {env!r}; use {' or '.join(DIAGNOSIS_ENVS)}")
    result = diagnose_gamma(parse_simulator_spec(spec), build_env(DIAGNOSIS_ENVS[env]()), log=log, **settings)
    if out is not None:
        files.write_json(out, result)
    return result


def diagnose_gamma(
    cfg: SimulatorConfig,
    env: Environment,
    states: int = 4,
    samples: int = 256,
    vs_k: int = 5,
    vs_calls: int = 32,
    seed: int = 0,
    log: Callable[[str], None] = print,
    models: ModelCache | None = None,
) -> dict:
    if not isinstance(cfg, LLMSimulatorFields):
        raise ValueError(f"gamma diagnosis needs one LLM simulator (frozen, persona_guided, vs or trainable), got mode {cfg.mode!r}")
    models = models or ModelCache()
    plain_cfg, vs_cfg = paired_configs(cfg, vs_k)
    plain_sim, vs_sim = build_simulator(plain_cfg, models), build_simulator(vs_cfg, models)
    rows = []
    for i, state in enumerate(dialogue_states(env, states, seed)):
        log(f"state {i + 1}/{states}: {samples} plain replies, {vs_calls} VS calls")
        plain = reply_stats(sample_plain(plain_sim, state, samples, seed * 1_000 + i))
        vs = reply_stats(sample_vs(vs_sim, state, samples, vs_calls, seed + i))
        ratio = plain["entropy"] / vs["entropy"] if vs["entropy"] > 0 else None
        rows.append(
            {
                "state": i,
                "task": state.task.task_id,
                "opener": state.context[-1].content if len(state.context) > 1 else "",
                "plain": plain,
                "vs": vs,
                "entropy_ratio": ratio,
            }
        )

    def mean(values):
        values = [v for v in values if v is not None and math.isfinite(v)]
        return sum(values) / len(values) if values else None

    summary = {
        side: {key: mean([r[side][key] for r in rows]) for key in ("top1_mass", "unique", "entropy", "zipf_slope")}
        for side in ("plain", "vs")
    }
    return {
        "simulator": plain_cfg.model_dump(mode="json"),
        "vs": vs_cfg.model_dump(mode="json"),
        "states": rows,
        "samples": samples,
        "mean": {**summary, "entropy_ratio": mean([r["entropy_ratio"] for r in rows])},
    }
