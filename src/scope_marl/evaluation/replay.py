"""Replay a recorded conversation through the rollout engine with scripted players.

Each role's turns are given back as text, exactly as a model would write them (calls in the
model-side tool format), so the engine parses, executes, records and scores them on its own. What
comes out is an episode the engine made: the check that our protocol, episode format and reward
reproduce a trajectory built elsewhere (bench/tau2_gold.py does it against tau2's own objects).
"""

from __future__ import annotations

from collections.abc import Sequence

from scope_marl.backends.scripted import ScriptedChatModel
from scope_marl.backends.seat import Seat
from scope_marl.backends.tool_format import format_turn
from scope_marl.config.rollout import RolloutConfig
from scope_marl.core.types import Episode, Message, SamplingParams
from scope_marl.envs.base import AGENT, USER, Environment, Task
from scope_marl.rollout.engine import RolloutEngine
from scope_marl.simulators.frozen import FrozenSimulator

UNLIMITED = SamplingParams(temperature=0.0, max_new_tokens=1_000_000)  # a scripted word is a token: never cut


def turn_texts(messages: Sequence[Message], role: str) -> list[str]:
    """What ``role`` wrote, turn by turn (its calls in Hermes text, verbatim when recorded so)."""
    out = []
    for m in messages:
        if m.role != role:
            continue
        if m.tool_calls is not None:
            out.append(m.raw if m.raw is not None else format_turn(m.content, m.tool_calls))
        else:
            out.append(m.content)
    return out


def replay(env: Environment, task: Task, messages: Sequence[Message], max_tool_calls: int = 1_000) -> Episode:
    """Play ``messages`` (after the environment's own opening) again through the engine."""
    played = list(messages[len(env.opening(task)) :])
    scripts = {role: turn_texts(played, role) or [""] for role in (AGENT, USER)}
    agent = Seat(model=ScriptedChatModel(scripts[AGENT], name="scripted-agent"), sampling=UNLIMITED)
    user = FrozenSimulator(ScriptedChatModel(scripts[USER], name="scripted-user"), UNLIMITED, simulator_id="scripted-user")
    config = RolloutConfig(group_size=1, progress=False, on_empty_reply="keep", max_tool_calls=max_tool_calls)
    return RolloutEngine(env, agent, user, config).run([task])[0]
