"""Persona-guided prompting (the paper's "RL-configured" baseline).

A prompt prefix asks the simulator to behave like a varied, imperfect person: change temperament,
contradict itself, refuse, wander off-topic, change style. It composes with any frozen simulator
by prefixing that simulator's prompt; the simulator id records the variant.
"""

from __future__ import annotations

import copy
import dataclasses

from scope_marl.simulators.frozen import LLMSimulator

PERSONA_GUIDANCE = (
    "Play a realistic, varied person, not a helpful assistant. Your temperament can change during the "
    "conversation: sometimes warm, sometimes impatient or suspicious. You may contradict something you said "
    "earlier, refuse requests, ask unrelated questions, go off-topic, or answer very briefly. Vary your style "
    "and length from one reply to the next."
)


def persona_guided(base: LLMSimulator, guidance: str = PERSONA_GUIDANCE) -> LLMSimulator:
    """A copy of ``base`` (same model, adapter, sampling) whose prompt starts with the guidance."""
    prefix = f"{guidance}\n\n{base.seat.prompt_prefix}" if base.seat.prompt_prefix else guidance
    guided = copy.copy(base)
    guided.seat = dataclasses.replace(base.seat, prompt_prefix=prefix)
    guided.simulator_id = f"persona-guided:{base.simulator_id}"
    return guided
