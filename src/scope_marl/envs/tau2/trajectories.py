"""Reference trajectories built directly as tau2 message objects, for checking our reward against tau2's.

``gold`` replays a task's gold actions (each call executed on a fresh tau2 environment for its exact
result), says every ``communicate_info`` string, and lets the user stop. ``perturbed`` gives the
gold trajectory with one thing wrong. ``empty`` is the agent that greets and does nothing more.
``tau2_score`` is tau2's own ``evaluate_simulation`` under ``EvaluationType.ALL`` on such a list.
"""

from __future__ import annotations

from collections.abc import Sequence
from copy import deepcopy
from dataclasses import dataclass, field

from scope_marl.envs.tau2.env import evaluate_all
from scope_marl.envs.tau2.package import domain, quiet_import

GREETING = "Hi! How can I help you today?"  # tau2's DEFAULT_FIRST_AGENT_MESSAGE (a test checks it is still tau2's)
HANDOVER = "Please go ahead on your side."  # what the agent says to let the user act next
DONE = "I have done my part."  # what the user says after acting
OPEN = "Hello, I need help."


@dataclass
class Trajectory:
    name: str
    messages: list
    termination: str = "user_stop"
    notes: dict = field(default_factory=dict)


def plan_of(tau2_task) -> list[tuple[str, str, dict]]:
    """The gold actions as (requestor, tool name, arguments)."""
    actions = (tau2_task.evaluation_criteria.actions if tau2_task.evaluation_criteria else None) or []
    return [(a.requestor, a.name, dict(a.arguments)) for a in actions]


def opening(tau2_task) -> tuple[list, str]:
    """How tau2 starts the task: its message history, else the agent's greeting; and who speaks next."""
    m = quiet_import("tau2.data_model.message")
    history = list(tau2_task.initial_state.message_history or []) if tau2_task.initial_state else []
    if not history:
        return [m.AssistantMessage(role="assistant", content=GREETING)], "user"
    last = history[-1]
    speaker = last.requestor if last.role == "tool" else ("user" if last.role == "assistant" else "assistant")
    return deepcopy(history), speaker


def build(domain_name: str, tau2_task, plan: Sequence[tuple[str, str, dict]], info: Sequence[str], last_user: str = "###STOP###") -> list:
    """A conversation that makes ``plan``'s calls in order (one per turn, each side handing over when
    the other must act), then says ``info`` and ends with ``last_user``; results come from a fresh env."""
    m = quiet_import("tau2.data_model.message")
    env = domain(domain_name).environment()
    state = tau2_task.initial_state
    env.set_state(
        initialization_data=state.initialization_data if state else None,
        initialization_actions=state.initialization_actions if state else None,
        message_history=list(state.message_history or []) if state else [],
    )
    msgs, speaker = opening(tau2_task)
    said = False  # whether the user has spoken yet (its first words open the request)

    def hand_over():
        nonlocal said
        if speaker == "user":
            msgs.append(m.UserMessage(role="user", content=DONE if said else OPEN))
            said = True
        else:
            msgs.append(m.AssistantMessage(role="assistant", content=HANDOVER))

    for k, (requestor, name, arguments) in enumerate(plan):
        if requestor != speaker:  # hand the turn over with a plain message
            hand_over()
            speaker = requestor
        call = m.ToolCall(id=f"call_{k}", name=name, arguments=arguments, requestor=requestor)
        cls = m.UserMessage if requestor == "user" else m.AssistantMessage
        msgs.append(cls(role=requestor, content=None, tool_calls=[call]))
        msgs.append(env.get_response(call))
    if speaker == "user":
        hand_over()
    msgs.append(m.AssistantMessage(role="assistant", content=" ".join(info) if info else "Is there anything else?"))
    msgs.append(m.UserMessage(role="user", content=last_user))
    return msgs


def gold(domain_name: str, tau2_task) -> Trajectory:
    info = (tau2_task.evaluation_criteria.communicate_info if tau2_task.evaluation_criteria else None) or []
    return Trajectory("gold", build(domain_name, tau2_task, plan_of(tau2_task), info))


def empty(tau2_task) -> Trajectory:
    """The agent greets (or, after a history, says nothing of use); the user stops at once."""
    m = quiet_import("tau2.data_model.message")
    msgs, speaker = opening(tau2_task)
    if speaker == "assistant":
        msgs.append(m.AssistantMessage(role="assistant", content="Is there anything else?"))
    return Trajectory("empty", [*msgs, m.UserMessage(role="user", content="###STOP###")])


def _changed(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "0"
    if isinstance(value, list):
        return value[:-1] if value else ["x"]
    return "changed"


def perturbed(domain_name: str, tau2_task) -> list[Trajectory]:
    """The gold trajectory with one gold action dropped, one argument changed, one communicate
    string removed, a wrong termination (the user never stops: max_steps), and a malformed call
    (the first action called with no arguments, before the real one)."""
    plan = plan_of(tau2_task)
    info = list((tau2_task.evaluation_criteria.communicate_info if tau2_task.evaluation_criteria else None) or [])
    out = []
    if plan:
        out.append(Trajectory("drop_action", build(domain_name, tau2_task, plan[:-1], info)))
    with_args = [k for k, (_, _, args) in enumerate(plan) if args]
    if with_args:
        k = with_args[0]
        requestor, name, args = plan[k]
        key = sorted(args)[0]
        changed = [*plan[:k], (requestor, name, {**args, key: _changed(args[key])}), *plan[k + 1 :]]
        out.append(Trajectory("change_argument", build(domain_name, tau2_task, changed, info), notes={"argument": f"{name}.{key}"}))
    if info:
        out.append(Trajectory("drop_communicate", build(domain_name, tau2_task, plan, info[1:])))
    out.append(Trajectory("wrong_termination", build(domain_name, tau2_task, plan, info, last_user="Thanks."), termination="max_steps"))
    if plan:
        requestor, name, _ = plan[0]
        out.append(Trajectory("malformed_call", build(domain_name, tau2_task, [(requestor, name, {"malformed": True}), *plan], info)))
    return out


def tau2_score(domain_name: str, tau2_task, trajectory: Trajectory) -> float:
    """tau2's own evaluator (``EvaluationType.ALL``) on a trajectory of tau2 messages."""
    return float(evaluate_all(domain_name, tau2_task, trajectory.messages, trajectory.termination).reward)
