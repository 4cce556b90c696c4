"""tau2-bench's domains (mock, retail, airline, telecom) as an environment, with tau2's own data,
prompts, tools, endings and evaluator.

- **Tasks and splits** come from tau2's ``tasks.json`` / ``split_tasks.json``. tau2 has no
  validation split; ours is fixed once: the last fifth (rounded up) of tau2's train split, in the
  split file's order, and ``train`` is the rest. ``test`` is tau2's test split, untouched; tau2's
  other split names (``base``, ``small``, ``full``) are served as they are. train, validation and
  test are checked disjoint when the domain loads.
- **Prompts** are built by tau2's own classes: the agent's is tau2's LLM-agent prompt (its
  instructions and the domain policy), the user's is tau2's user-simulator prompt (its guidelines,
  with the tool variant when the user has tools, and the task's scenario). Tools reach a model as
  schemas through the model side; nothing here cuts a prompt: one that does not fit the model's
  context ends the episode TRUNCATED in the engine, and is counted there.
- **An episode** starts as tau2 starts one: a fresh environment with the task's initial data,
  actions and history, and the agent's fixed greeting when there is no history. Calls run through
  tau2's ``Environment.get_response`` (the agent on the domain's tools; in telecom the user on its
  device tools). It ends as tau2's orchestrator ends it: a user message with ``###STOP###``,
  ``###TRANSFER###`` or ``###OUT-OF-SCOPE###``; ``max_steps`` steps (every message is a step, and so
  is each batch of tool results); ``max_errors`` failed tool calls. The agent cannot end it.
- **The reward** is tau2's evaluator on the episode converted to tau2's messages (``convert.py``),
  under ``EvaluationType.ALL``; any ending but the user's stop scores 0, as in tau2. Tasks scored by
  natural-language assertions need a judge (an injected callable, off by default). That score r is
  the episode's *success* (``metadata["tau2_reward"]``). The agent's reward is r; the user's is r
  (``cooperative``), 1 - r (``adversarial``) or the variance curriculum (``curriculum``, below).
- **Malformed tool calls** cost the role that wrote them ``malformed_call_penalty`` each (default
  0.1), taken from that role's own reward and capped at 1 (tau2's reward range), so a penalty never
  outweighs a whole success. The caller pays because only the caller could have written the call
  well: the agent is not charged for a user's broken device call, nor the user for the agent's.
- **The variance curriculum** rewards the user for tasks on which the agent is neither always right
  nor always wrong: ``exp(-(var - 0.25)^2 / 0.02)`` where var is the population variance (ddof 0)
  of the agent's successes over the task's group, at most 0.25 for 0/1 outcomes (half right: reward
  1; all right or all wrong: 0.044). It is one number per group, so a GRPO group baseline would make
  every advantage exactly zero (the reference release's defect); the simulator's learner must
  compare groups with each other instead (``baseline: batch``, checked when a run is configured).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from scope_marl.core.types import TOOL, Episode, Message, ToolCall
from scope_marl.envs.base import AGENT, USER, Environment, Task, malformed_calls
from scope_marl.envs.tau2.convert import TAU2_ROLE, from_tau2, to_tau2
from scope_marl.envs.tau2.package import DOMAINS, domain, quiet_import

STOP_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")  # tau2's user-simulator endings
SIMULATOR_REWARDS = ("cooperative", "adversarial", "curriculum")
PENALTY_CAP = 1.0  # tau2's reward lies in [0, 1]: a role loses at most the whole range to malformed calls
OURS = ("train", "validation", "test")

# Judge(assertions, transcript) -> one verdict per assertion. Any chat backend can be one (assembly.llm_judge).
Judge = Callable[[Sequence[str], str], Sequence[bool]]


def count_steps(played: Sequence[Message]) -> int:
    """tau2's orchestrator steps after the opening: every message is one, and so is each batch of tool results."""
    return sum(1 for i, m in enumerate(played) if m.role != TOOL or i == 0 or played[i - 1].role != TOOL)


class SplitError(ValueError):
    """A split that does not exist, or tau2 data whose splits overlap."""


def validation_size(train_size: int) -> int:
    """The last fifth of tau2's train split, rounded up, is our validation split."""
    return math.ceil(train_size / 5)


class Tau2(Environment):
    name = "tau2"

    def __init__(
        self,
        domain: str = "retail",
        max_steps: int = 200,
        max_errors: int = 10,
        judge: Judge | None = None,
        simulator_reward: str = "cooperative",
        malformed_call_penalty: float = 0.1,
    ):
        if domain not in DOMAINS:
            raise ValueError(f"unknown tau2 domain {domain!r}; choose one of {', '.join(DOMAINS)}")
        if simulator_reward not in SIMULATOR_REWARDS:
            raise ValueError(f"unknown simulator_reward {simulator_reward!r}; choose one of {', '.join(SIMULATOR_REWARDS)}")
        if malformed_call_penalty < 0:
            raise ValueError(f"malformed_call_penalty must be >= 0 (0 turns it off), got {malformed_call_penalty}")
        self.simulator_reward = simulator_reward
        self.malformed_call_penalty = malformed_call_penalty
        self.domain = domain
        self.max_steps = max_steps  # tau2's command-line default (its Orchestrator class defaults to 100)
        self.max_errors = max_errors
        self.judge = judge
        self._cache: dict[str, Any] = {}  # tau2 objects, rebuilt after unpickling

    def __getstate__(self):
        return {**self.__dict__, "_cache": {}}

    # ---- tau2's data ------------------------------------------------------------------------------
    def _tau2_tasks(self) -> dict:
        if "tasks" not in self._cache:
            self._cache["tasks"] = {t.id: t for t in domain(self.domain).module.get_tasks(None)}
            self._cache["splits"] = self._splits()
        return self._cache["tasks"]

    def _splits(self) -> dict[str, list[str]]:
        tau2 = dict(domain(self.domain).module.get_tasks_split())
        splits = {name: list(ids) for name, ids in tau2.items() if name not in OURS}
        if "train" in tau2:
            train = list(tau2["train"])
            cut = len(train) - validation_size(len(train))
            splits["train"], splits["validation"] = train[:cut], train[cut:]
        if "test" in tau2:
            splits["test"] = list(tau2["test"])
        for i, a in enumerate(OURS):
            for b in OURS[i + 1 :]:
                shared = set(splits.get(a, [])) & set(splits.get(b, []))
                if shared:
                    raise SplitError(
                        f"tau2 {self.domain}: splits {a} and {b} share tasks {sorted(shared)[:5]}; the tau2 data is inconsistent"
                    )
        return splits

    def task_of(self, task: Task):
        """tau2's Task object for one of our tasks."""
        return self._tau2_tasks()[task.task_id]

    def reference_environment(self):
        """One tau2 environment kept for prompts and schemas (episodes each get their own)."""
        if "environment" not in self._cache:
            self._cache["environment"] = domain(self.domain).environment()
        return self._cache["environment"]

    # ---- the Environment interface ----------------------------------------------------------------
    def tasks(self, split: str = "train") -> list[Task]:
        by_id = self._tau2_tasks()
        splits = self._cache["splits"]
        if split not in splits:
            raise SplitError(f"tau2 {self.domain} has no {split!r} split; it has {', '.join(sorted(splits))}")
        return [Task(task_id=i, split=split, data={"domain": self.domain}) for i in splits[split] if i in by_id]

    def system_prompt(self, task: Task, role: str) -> str:
        env = self.reference_environment()
        if role == AGENT:
            agent = quiet_import("tau2.agent.llm_agent")
            return agent.LLMAgent(tools=env.get_tools(), domain_policy=env.get_policy()).system_prompt
        user = quiet_import("tau2.user.user_simulator")
        return user.UserSimulator(tools=self._user_tools() or None, instructions=str(self.task_of(task).user_scenario)).system_prompt

    def _user_tools(self) -> list:
        try:
            return self.reference_environment().get_user_tools()
        except ValueError:  # tau2: "User tools not available" (mock, retail, airline)
            return []

    def tools(self, task: Task, role: str) -> list[dict]:
        key = f"schemas:{role}"
        if key not in self._cache:
            tools = self.reference_environment().get_tools() if role == AGENT else self._user_tools()
            self._cache[key] = [t.openai_schema for t in tools]
        return self._cache[key]

    def _history(self, task: Task) -> list:
        state = self.task_of(task).initial_state
        return list(state.message_history or []) if state is not None else []

    def opening(self, task: Task) -> list[Message]:
        history = self._history(task)
        if history:
            return from_tau2(history)
        orchestrator = quiet_import("tau2.orchestrator.orchestrator")
        return [Message(role=AGENT, content=orchestrator.DEFAULT_FIRST_AGENT_MESSAGE.content)]

    def first_speaker(self, task: Task) -> str:
        """Who answers the opening: the user after the greeting, else as tau2 routes the last history message."""
        opening = self.opening(task)
        last = opening[-1]
        if last.role == TOOL:
            return last.requestor or AGENT
        if last.tool_calls is not None:
            raise ValueError(f"tau2 task {task.task_id}: its history ends on a tool call without a result")
        return self.other(last.role)

    def start(self, task: Task):
        env = domain(self.domain).environment()
        state = self.task_of(task).initial_state
        env.set_state(
            initialization_data=state.initialization_data if state else None,
            initialization_actions=state.initialization_actions if state else None,
            message_history=self._history(task),
        )
        return env

    def execute(self, task: Task, state, role: str, call: ToolCall) -> Message:
        m = quiet_import("tau2.data_model.message")
        requestor = call.requestor or role  # a call carried for another role uses that role's tools, as tau2 routes it
        result = state.get_response(m.ToolCall(id=call.id, name=call.name, arguments=dict(call.arguments), requestor=TAU2_ROLE[requestor]))
        return Message(role=TOOL, content=result.content or "", tool_call_id=result.id, requestor=requestor, error=result.error)

    def termination(self, task: Task, messages: Sequence[Message]) -> str | None:
        """tau2's termination reason after ``messages`` (None: play on)."""
        last = messages[-1]
        if last.role == USER and last.tool_calls is None and any(t in last.content for t in STOP_TOKENS):
            return "user_stop"
        if count_steps(messages[len(self.opening(task)) :]) >= self.max_steps:
            return "max_steps"
        if sum(1 for m in messages if m.role == TOOL and m.error) >= self.max_errors:
            return "too_many_errors"
        return None

    def is_done(self, task: Task, messages: Sequence[Message]) -> bool:
        return self.termination(task, messages) is not None

    def evaluate(self, task: Task, messages: Sequence[Message], termination: str | None = None):
        """tau2's RewardInfo for a finished conversation (cached for the last one asked)."""
        termination = termination or self.termination(task, messages) or "user_stop"
        key = (task.task_id, termination, tuple(m.model_dump_json() for m in messages))
        if self._cache.get("last_key") != key:
            self._cache["last_key"], self._cache["last_info"] = key, tau2_reward(self, task, messages, termination)
        return self._cache["last_info"]

    def penalty(self, messages: Sequence[Message], role: str) -> float:
        """What ``role`` pays for its own malformed tool calls in this conversation."""
        return min(self.malformed_call_penalty * malformed_calls(messages).get(role, 0), PENALTY_CAP)

    def rewards(self, task: Task, messages: Sequence[Message]) -> dict[str, float]:
        r = float(self.evaluate(task, messages).reward)
        # curriculum: a placeholder of r until group_rewards sees the whole group
        user = 1.0 - r if self.simulator_reward == "adversarial" else r
        return {AGENT: r - self.penalty(messages, AGENT), USER: user - self.penalty(messages, USER)}

    def group_rewards(self, task: Task, episodes: Sequence[Episode]) -> None:
        """The variance curriculum: every scored episode of the group gets the same user reward
        (less its own penalty), from the variance of the agent's successes over the group."""
        if self.simulator_reward != "curriculum":
            return
        scored = [e for e in episodes if USER in e.rewards and "tau2_reward" in e.metadata]
        if not scored:
            return
        successes = [float(e.metadata["tau2_reward"]) for e in scored]
        mean = sum(successes) / len(successes)
        variance = sum((s - mean) ** 2 for s in successes) / len(successes)
        reward = curriculum_reward(variance)
        for e in scored:
            e.rewards[USER] = reward - self.penalty(e.messages, USER)
            e.metadata["curriculum"] = {"success_variance": variance, "reward": reward, "group_size": len(scored)}

    def episode_metadata(self, task: Task, messages: Sequence[Message]) -> dict[str, Any]:
        termination = self.termination(task, messages)
        out: dict[str, Any] = {"domain": self.domain, "termination": termination}
        malformed = malformed_calls(messages)
        if malformed:
            out["malformed_calls"] = malformed
        if termination is not None:
            info = self.evaluate(task, messages)
            out["tau2_reward"] = float(info.reward)
            out["success"] = abs(float(info.reward) - 1.0) <= 1e-6  # tau2's own test of a successful simulation
            out["reward_breakdown"] = {str(k.value if hasattr(k, "value") else k): v for k, v in (info.reward_breakdown or {}).items()}
        return out

    def describe(self) -> dict[str, Any]:
        self._tau2_tasks()
        sizes = {name: len(ids) for name, ids in self._cache["splits"].items()}
        return {
            "name": self.name,
            "domain": self.domain,
            "max_steps": self.max_steps,
            "max_errors": self.max_errors,
            "simulator_reward": self.simulator_reward,
            "malformed_call_penalty": self.malformed_call_penalty,
            "splits": sizes,
        }


def curriculum_reward(variance: float) -> float:
    """exp(-(var - 0.25)^2 / 0.02): 1 when the agent succeeds on half of the group, 0.044 at var 0."""
    return math.exp(-((variance - 0.25) ** 2) / 0.02)


def evaluate_all(domain_name: str, tau2_task, tau2_messages: list, termination: str):
    """tau2's own ``evaluate_simulation`` under ``EvaluationType.ALL`` on a list of tau2 messages."""
    ev = quiet_import("tau2.evaluator.evaluator")
    sim_models = quiet_import("tau2.data_model.simulation")
    now = quiet_import("tau2.utils.utils").get_now()
    simulation = sim_models.SimulationRun(
        id=str(uuid.uuid4()),
        task_id=tau2_task.id,
        start_time=now,
        end_time=now,
        duration=0.0,
        termination_reason=termination,
        messages=tau2_messages,
    )
    return ev.evaluate_simulation(
        simulation=simulation, task=tau2_task, evaluation_type=ev.EvaluationType.ALL, solo_mode=False, domain=domain_name
    )


def tau2_reward(env: Tau2, task: Task, messages: Sequence[Message], termination: str):
    """:func:`evaluate_all` on our messages; with a judge, tasks scored by natural-language assertions
    get the judge's verdicts multiplied in."""
    tasks_models = quiet_import("tau2.data_model.tasks")
    tau2_task = env.task_of(task)
    criteria = tau2_task.evaluation_criteria
    nl = tasks_models.RewardType.NL_ASSERTION
    if criteria is None or nl not in (criteria.reward_basis or []):
        return evaluate_all(env.domain, tau2_task, to_tau2(messages), termination)
    if env.judge is None:
        raise ValueError(
            f"tau2 task {tau2_task.id} is scored by natural-language assertions, which need an LLM judge; "
            "pass judge= (e.g. assembly.llm_judge(model)) or leave such tasks out"
        )
    rest = tau2_task.model_copy(deep=True)
    rest.evaluation_criteria.reward_basis = [b for b in criteria.reward_basis if b != nl]
    info = evaluate_all(env.domain, rest, to_tau2(messages), termination)
    transcript = "\n".join(f"{m.role}: {m.content}" for m in messages if m.role != TOOL and m.content)
    verdicts = list(env.judge(criteria.nl_assertions or [], transcript))
    info.reward = info.reward * float(all(verdicts))
    info.reward_breakdown = {**(info.reward_breakdown or {}), nl: float(all(verdicts))}
    return info
