"""Verbalized Sampling (VS): the simulator states k candidate replies with probabilities; one is drawn.

A mode-collapsed LLM sampled directly keeps giving its modal reply. Asked to *verbalize* a
distribution ("give 5 replies a person might write, with their probabilities"), it spreads mass
over real alternatives; drawing one of them restores diversity (arXiv 2510.01171). Only the drawn
text enters the conversation; every attempt, the candidates, the draw and any fallback are kept in
the turn's record (``Episode.metadata["simulator_turns"]``).

How the JSON is obtained:
- OpenAI-compatible servers get a strict JSON schema (exactly k items) in ``response_format``;
- local token-level models get the JSON *shape* forced: the skeleton is written by us and the
  model only fills each text (stopped at a quote) and probability (stopped at a delimiter), because
  a 135M model rarely writes valid JSON on its own;
- anything else is prompted and parsed leniently by :func:`parse_candidates`.
Every raw output goes through :func:`parse_candidates`, so normalization rules live in one place.
On an empty parse the call is retried up to ``max_retries`` times, then the raw text is the reply.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from typing import Literal

from scope_marl.backends.base import ChatModel, SamplingParams, TokenChatModel
from scope_marl.backends.tool_format import format_call, notation_example, parse_call_notation
from scope_marl.core.seeds import derive_seed
from scope_marl.core.types import Message, ToolCall
from scope_marl.simulators.base import Response, SimulatorTurn
from scope_marl.simulators.candidates import Candidate, candidate_entropy, draw_candidate, parse_candidates
from scope_marl.simulators.frozen import LLMSimulator

__all__ = ["Candidate", "VerbalizedSampling", "parse_candidates", "vs_metrics"]

Method = Literal["prob", "random"]
Variant = Literal["standard", "cot", "multi"]


def vs_instruction(
    k: int, method: Method, variant: Variant, tail: float | None, exclude: Sequence[str] = (), tools: Sequence[dict] = ()
) -> str:
    """The request appended to the simulator's system prompt. With tools, a candidate is a whole user
    turn: a message, an ending token the instructions name, or one tool call in the call notation."""
    item = '{"text": "<reply>", "probability": <number between 0 and 1>}' if method == "prob" else '{"text": "<reply>"}'
    lines = [
        f"Instead of one reply, write {k} different replies this person might plausibly give next"
        + (", each with its probability of being the reply" if method == "prob" else "")
        + ".",
    ]
    if tail is not None and method == "prob":
        lines.append(f"Sample from the tails of the distribution: each probability must be below {tail}.")
    if tools:
        lines.append(
            "Each reply is one whole turn: a message to the agent, or a call of one of your tools written as "
            f"tool_name(argument=value, ...) with no quotes, for example {notation_example(tools)}"
        )
    if exclude:
        lines.append("They must differ from these earlier ones: " + " | ".join(exclude))
    reasoning = '"reasoning": "<brief thoughts about how this person may react>", ' if variant == "cot" else ""
    lines.append(f'Answer with JSON only: {{{reasoning}"responses": [{item}, ...]}}')
    return "\n".join(lines)


def json_schema(k: int, method: Method, variant: Variant) -> dict:
    """Strict response_format for OpenAI-compatible servers: exactly k items."""
    item = {"text": {"type": "string"}}
    if method == "prob":
        item["probability"] = {"type": "number"}
    props: dict = {
        "responses": {
            "type": "array",
            "minItems": k,
            "maxItems": k,
            "items": {"type": "object", "properties": item, "required": list(item), "additionalProperties": False},
        }
    }
    if variant == "cot":
        props = {"reasoning": {"type": "string"}, **props}
    return {
        "type": "json_schema",
        "json_schema": {
            "name": "verbalized_candidates",
            "strict": True,
            "schema": {"type": "object", "properties": props, "required": list(props), "additionalProperties": False},
        },
    }


class VerbalizedSampling(LLMSimulator):
    kind = "vs"

    def __init__(
        self,
        model: ChatModel,
        k: int = 5,
        method: Method = "prob",
        variant: Variant = "standard",
        tail_threshold: float | None = None,
        calls: int = 2,
        sampling: SamplingParams | None = None,
        prompt_prefix: str = "",
        adapter: str | None = None,
        max_retries: int = 2,
        constrained: bool | None = None,
        seed: int = 0,
        simulator_id: str | None = None,
    ):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        super().__init__(
            model,
            sampling,
            prompt_prefix,
            adapter,
            simulator_id or f"vs-{method}{'-' + variant if variant != 'standard' else ''}:{model.name}",
        )
        self.k, self.method, self.variant = k, method, variant
        self.tail_threshold = tail_threshold
        self.calls = calls if variant == "multi" else 1
        self.max_retries = max_retries
        self.constrained = isinstance(model, TokenChatModel) if constrained is None else constrained
        if self.constrained and not isinstance(model, TokenChatModel):
            raise ValueError(f"constrained VS decoding needs a local token-level model; {model.name} is not one")
        self.rng = random.Random(seed)
        self._calls_made = 0

    def direct_seat(self):
        return None  # one reply takes several calls and a draw: the engine must go through respond()

    def batch_metrics(self, episodes) -> dict:
        metrics = vs_metrics(episodes)
        return {"verbalized_sampling": metrics} if metrics else {}

    def identity(self) -> dict:
        return {**super().identity(), "k": self.k, "method": self.method, "variant": self.variant, "tail_threshold": self.tail_threshold}

    # ---- one user turn per request ------------------------------------------------------------
    def respond(self, turns: Sequence[SimulatorTurn]) -> list[Response[str]]:
        chats = self.chats(turns)
        records = [{"mode": "vs", "method": self.method, "k": self.k, "attempts": []} for _ in turns]
        candidates: list[list[Candidate]] = [[] for _ in turns]
        raw_last = [""] * len(turns)
        per_call = [self.k // self.calls + (1 if c < self.k % self.calls else 0) for c in range(self.calls)]
        for _attempt in range(self.max_retries + 1):
            pending = [i for i, c in enumerate(candidates) if not c]
            if not pending:
                break
            gathered: dict[int, list[Candidate]] = {i: [] for i in pending}
            for k_call in per_call:  # VS-Multi: several calls, each told what was already said
                prompts = [self._with_instruction(chats[i], k_call, [c.text for c in gathered[i]], turns[i].tools) for i in pending]
                raws = self._generate(prompts, k_call)
                for i, raw in zip(pending, raws):
                    found = parse_candidates(raw, k_call, self.method)
                    records[i]["attempts"].append({"raw": raw, "parsed": len(found)})
                    gathered[i] += found
                    raw_last[i] = raw
            for i in pending:
                # Re-normalize what the calls gathered as one set (merge duplicates across calls, keep k).
                items = [{"text": c.text, "probability": c.probability} for c in gathered[i]]
                candidates[i] = parse_candidates(json.dumps({"responses": items}), self.k, self.method) if items else []
        out = []
        for turn, record, cands, raw in zip(turns, records, candidates, raw_last):
            if turn.rules is not None:
                cands = [Candidate(turn.rules(c.text), c.probability) for c in cands]
            if cands:
                index = draw_candidate(cands, self.rng)
                calls = [parse_call_notation(c.text, turn.tools) if turn.tools else None for c in cands]
                reply = cands[index].text
                if calls[index] is not None:  # the drawn candidate is a call: it executes as the user's turn
                    reply = format_call(ToolCall(id="vs", name=calls[index][0], arguments=calls[index][1]))
                record.update(
                    candidates=[
                        {"text": c.text, "probability": c.probability, **({"call": call[0]} if call else {})}
                        for c, call in zip(cands, calls)
                    ],
                    chosen=index,
                    fallback=False,
                    entropy=candidate_entropy(cands),
                )
            else:
                reply = turn.rules(raw) if turn.rules is not None else raw
                record.update(candidates=[], chosen=None, fallback=True, entropy=None)
            out.append(Response(reply, record))
        return out

    def _with_instruction(self, chat: list[Message], k: int, exclude: list[str], tools: Sequence[dict] = ()) -> list[Message]:
        system, *rest = chat
        text = f"{system.content}\n\n{vs_instruction(k, self.method, self.variant, self.tail_threshold, exclude, tools)}"
        return [Message(role="system", content=text), *rest]

    def _seeded(self, sampling: SamplingParams) -> SamplingParams:
        self._calls_made += 1
        base = sampling.seed if sampling.seed is not None else 0
        return sampling.model_copy(update={"seed": derive_seed(base, self._calls_made, bits=31)})

    def _generate(self, prompts: list[list[Message]], k: int) -> list[str]:
        adapters = [self.seat.adapter] * len(prompts) if self.seat.adapter else None
        if self.constrained:
            return self._generate_constrained(prompts, k, adapters)
        kwargs = {}
        if hasattr(self.seat.model, "base_url"):  # OpenAI-compatible: let the server enforce the shape
            kwargs["response_format"] = json_schema(k, self.method, self.variant)
        sampling = self._seeded(self.seat.sampling.model_copy(update={"max_new_tokens": self.seat.sampling.max_new_tokens * k}))
        return [g.text for g in self.seat.model.generate(prompts, sampling, adapters, **kwargs)]

    # ---- constrained decoding for local models ----------------------------------------------
    def _generate_constrained(self, prompts: list[list[Message]], k: int, adapters) -> list[str]:
        """Write the JSON skeleton ourselves; the model fills only the free fields.

        Each field is one batched ``generate_ids`` call over all pending turns, stopped at the
        field's delimiter; prompts extend the same token prefix, so the backend's prefix cache
        prefills only the new skeleton text.
        """
        model: TokenChatModel = self.seat.model  # type: ignore[assignment]
        heads = [model.encode_chat(p) for p in prompts]
        docs = ['{"reasoning": "' if self.variant == "cot" else '{"responses": [' for _ in prompts]
        keys = [("vs", id(self), self._calls_made, i) for i in range(len(prompts))]
        text_sampling = self.seat.sampling.model_copy(update={"stop": ['"', "\n"]})
        number_sampling = self.seat.sampling.model_copy(update={"stop": [",", "}", "\n", " "], "max_new_tokens": 6})

        def fill(sampling: SamplingParams) -> list[str]:
            gens = model.generate_ids(
                [h + model.encode_text(d) for h, d in zip(heads, docs)], self._seeded(sampling), adapters, cache_keys=keys
            )
            return [g.text for g in gens]

        try:
            if self.variant == "cot":
                docs = [d + json.dumps(t.strip())[1:-1] + '", "responses": [' for d, t in zip(docs, fill(text_sampling))]
            for j in range(k):
                docs = [d + (", " if j else "") + '{"text": "' for d in docs]
                docs = [d + json.dumps(t.strip())[1:-1] + '"' for d, t in zip(docs, fill(text_sampling))]
                if self.method == "prob":
                    docs = [d + ', "probability": ' for d in docs]
                    docs = [d + _json_number(n) for d, n in zip(docs, fill(number_sampling))]
                docs = [d + "}" for d in docs]
        finally:
            model.release(keys)
        return [d + "]}" for d in docs]


def _json_number(text: str) -> str:
    """The probability a model wrote into the skeleton, as a JSON value (null when it wrote no number)."""
    match = re.match(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*(%?)", text)
    if match is None:
        return "null"
    number = "0" + match[1] if match[1].startswith(".") else match[1]
    return f'"{number}%"' if match[2] else number


def vs_metrics(episodes) -> dict:
    """Parse success rate, fallback rate, mean valid k and candidate entropy over VS turns."""
    turns = [t for e in episodes for t in e.metadata.get("simulator_turns", []) if t.get("mode") == "vs"]
    attempts = [a for t in turns for a in t["attempts"]]
    if not turns:
        return {}
    entropies = [t["entropy"] for t in turns if t["entropy"] is not None]
    valid = [len(t["candidates"]) for t in turns if not t["fallback"]]
    return {
        "vs_turns": len(turns),
        "parse_success_rate": sum(a["parsed"] > 0 for a in attempts) / len(attempts),
        "fallback_rate": sum(t["fallback"] for t in turns) / len(turns),
        "mean_valid_k": sum(valid) / len(valid) if valid else 0.0,
        "mean_candidate_entropy": sum(entropies) / len(entropies) if entropies else 0.0,
    }
