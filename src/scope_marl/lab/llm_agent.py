"""The lab's LLM agent: a language model with a LoRA adapter writes each persuasion message.

Each turn every live dialogue gets one message of at most ``max_new_tokens`` tokens, sampled from
the model with the agent's adapter on a chat prompt holding the dialogue so far: a fixed system
prompt, the user's opening line, then the agent's earlier messages and the user's replies. The
:class:`StrategyClassifier` maps the message to one of the game's strategies, and the lab's act
simulators answer that strategy exactly as they answer the tabular policy. A message the
classifier cannot place (``other``) persuades no one: the turn is spent, the simulator is not
asked, and the user answers with the game's non-terminal "unclear" act (:data:`UNCLEAR_ACT`) shown
as a puzzled reply (:data:`UNCLEAR_REPLIES`); its share is reported. (Answering ``other`` as a
uniformly drawn strategy, the first rule, made garbage a lottery ticket on a direct ask, and
single-simulator training collapsed onto unplaceable text: a classifier hack, not the paper's
collapse.) The user's act is otherwise shown back to the agent as a reply text drawn from a fixed
table per act (:data:`REPLIES`).

Each dialogue's agent side is recorded token-in-token-out by the engine's :class:`StreamBuilder`, so
the project's :class:`Learner` trains on exactly the sampled ids and log-probs (the on-policy
exactness test of the LLM path holds here too).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor

from scope_marl.backends.hf import HFChatModel
from scope_marl.core.seeds import derive_seed
from scope_marl.core.types import Episode, Message, SamplingParams
from scope_marl.lab.classifier import OTHER, StrategyClassifier
from scope_marl.lab.games import Game
from scope_marl.rollout.streams import StreamBuilder

ROLE = "agent"

# The agent's instructions. Plain, like a fundraiser's brief; at temperature 0.7 SmolLM2-135M-Instruct
# answers them with emotional appeals, facts and direct asks now and then (GRPO can only reinforce
# what is sampled; listing the strategies with examples in the prompt made its messages *less*
# coherent, measured on 64 samples each, see docs/lab.md).
SYSTEM_PROMPTS = {
    "theory": (
        "You are a fundraiser for Save the Children, a charity that helps children in poverty. Persuade the user to donate. "
        "Reply in one or two sentences."
    ),
    "p4g": (
        "You are a fundraiser for Save the Children, a charity that helps children in poverty. Persuade the user to donate "
        "part of their task payment. Reply in one or two sentences."
    ),
}
OPENING = "Hi, what is this about?"

# What the agent reads after each user act; one of the texts is drawn per reply (the user's act is
# the game's; the wording only varies so the agent sees natural replies, not a code).
REPLIES: dict[str, tuple[str, ...]] = {
    # theory
    "agree": ("Okay, you convinced me. I'll donate.", "Alright, count me in. I will give something."),
    "engage": ("That's interesting. Tell me more.", "I see. Go on."),
    "question": ("How do I know my money really helps?", "Hmm, why should I trust this charity?"),
    "refuse": ("No thanks, I'm not interested.", "Sorry, I won't donate."),
    # p4g (agree is shared)
    "disagree": ("I don't think I want to donate.", "No, not today."),
    "negative": ("I don't like being pushed for money.", "That sounds like a scam to me."),
    "positive": ("That's a good cause.", "I like what they do."),
    "ask": ("How would the donation work?", "What does the charity actually do?"),
    "neutral": ("Okay.", "I see."),
    "other": ("I'm doing fine, thanks.", "Sure."),
}
# The user's act after a message that plays no strategy: it continues the dialogue and is worth
# little (theory: a question left open, 0.1 at the last turn; p4g: an off-topic reply, -0.03), so
# an unplaceable message never earns more than the turn it wastes.
UNCLEAR_ACT = {"theory": "question", "p4g": "other"}
UNCLEAR_REPLIES = ("Sorry, what do you mean?", "I don't follow. What are you asking me?")


class LLMAgent:
    """The agent side of the LLM lab: a model, its trainable adapter and the fixed prompt, table and classifier."""

    def __init__(self, chat: HFChatModel, game: Game, adapter: str = ROLE, max_new_tokens: int = 32, temperature: float = 0.7):
        if game.name not in SYSTEM_PROMPTS:
            raise ValueError(f"the LLM lab has no agent prompt for game {game.name!r}; it knows {sorted(SYSTEM_PROMPTS)}")
        missing = [a for a in game.acts if a not in REPLIES]
        if missing:
            raise ValueError(f"game {game.name!r} has user acts without reply texts: {missing}")
        self.chat, self.game, self.adapter = chat, game, adapter
        self.unclear_act = game.acts.index(UNCLEAR_ACT[game.name])
        self.sampling = SamplingParams(temperature=temperature, top_p=1.0, max_new_tokens=max_new_tokens)
        self.classifier = StrategyClassifier(game.name, game.strategies)
        self._batches = itertools.count()

    def batch(self, n: int, seed: int) -> LLMTurns:
        """A batch of ``n`` new dialogues to hand to ``episodes.play`` as its agent."""
        return LLMTurns(self, n, seed, next(self._batches))


class LLMTurns:
    """``n`` dialogues of the LLM agent in progress: views, token streams, messages and labels per row."""

    def __init__(self, agent: LLMAgent, n: int, seed: int, batch_id: int):
        self.agent, self.n, self.seed, self.batch_id = agent, n, seed, batch_id
        system = Message(role="system", content=SYSTEM_PROMPTS[agent.game.name])
        self.views = [[system, Message(role="user", content=OPENING)] for _ in range(n)]
        self.builders = [StreamBuilder(ROLE, agent.chat, agent.adapter) for _ in range(n)]
        self.messages: list[list[str]] = [[] for _ in range(n)]
        self.labels = torch.full((n, agent.game.turns), -1, dtype=torch.long)  # strategy index, len(strategies) = other
        self.tokens = 0

    def choose(self, turn: int, previous: Tensor, alive: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        """Write one message per live dialogue and classify it (``episodes.Agent``): the strategy's
        index, or -1 where the message plays none (``other``). The log-prob and entropy returned are
        the message's summed token log-prob and mean token entropy."""
        game, agent = self.agent.game, self.agent
        rows = alive.nonzero().flatten().tolist()
        if turn > 0:
            variants = torch.randint(1 << 30, (len(rows),), generator=generator).tolist()
            for i, v in zip(rows, variants):
                unclear = int(self.labels[i, turn - 1]) == len(game.strategies)
                texts = UNCLEAR_REPLIES if unclear else REPLIES[game.acts[int(previous[i])]]
                self.views[i].append(Message(role="user", content=texts[v % len(texts)]))
        prompts = [self.builders[i].prompt(self.views[i]) for i in rows]
        generations = agent.chat.generate_ids(
            prompts,
            agent.sampling,
            adapters=[agent.adapter] * len(rows),
            cache_keys=[self._key(i) for i in rows],
            seeds=[derive_seed(self.seed, i, turn) for i in rows],
        )
        strategy = torch.zeros(self.n, dtype=torch.long)
        logp, entropy = torch.zeros(self.n), torch.zeros(self.n)
        for i, generation in zip(rows, generations):
            self.views[i].append(Message(role="assistant", content=generation.text))
            self.builders[i].add_turn(self.views[i], generation)
            self.messages[i].append(generation.text)
            label = agent.classifier.index(generation.text)
            self.labels[i, turn] = label
            strategy[i] = label if label < len(game.strategies) else -1
            logp[i] = sum(generation.logprobs or [])
            entropy[i] = sum(generation.entropies or []) / max(1, len(generation.entropies or []))
            self.tokens += len(generation.token_ids)
        return strategy, logp, entropy

    def _key(self, row: int) -> tuple:
        return ("lab-llm", id(self.agent), self.batch_id, row)

    def close(self) -> None:
        """Free the cached key/value states of this batch's conversations."""
        self.agent.chat.release([self._key(i) for i in range(self.n)])

    def episodes(self, rewards: Tensor, group_ids: Sequence[str], simulators: Sequence[str], group_size: int) -> list[Episode]:
        """The batch as episodes for the :class:`Learner`: the agent's stream with its reward."""
        out = []
        for i, builder in enumerate(self.builders):
            stream = builder.stream.model_copy(update={"reward": float(rewards[i])})
            out.append(
                Episode(
                    episode_id=f"lab-llm-{self.batch_id}-{i}",
                    task_id=f"lab:{self.agent.game.name}",
                    group_id=group_ids[i],
                    simulator_id=simulators[i // group_size],
                    streams={ROLE: stream},
                    rewards={ROLE: float(rewards[i])},
                )
            )
        return out

    def label_names(self) -> list[list[str]]:
        """Each dialogue's classified strategies, turn by turn (``other`` included)."""
        names = [*self.agent.game.strategies, OTHER]
        return [[names[label] for label in row if label >= 0] for row in self.labels.tolist()]
