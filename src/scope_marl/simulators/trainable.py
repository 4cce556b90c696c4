"""A trainable simulator: the user side comes from a model the learner updates (co-training).

By default it is its own LoRA adapter on the shared base model, so the agent, the simulator and
the frozen KL reference (adapters disabled) all live on one set of weights. Its seat is marked
trainable, so the rollout engine records a RoleStream for it exactly like the agent's (full prompt
context, loss mask, rollout log-probs, reward).
"""

from __future__ import annotations

from scope_marl.simulators.frozen import LLMSimulator

DEFAULT_ADAPTER = "simulator"


class TrainableSimulator(LLMSimulator):
    kind = "trainable"
    trainable = True
    default_adapter = DEFAULT_ADAPTER
