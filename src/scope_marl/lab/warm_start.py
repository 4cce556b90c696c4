"""The LLM lab's warm start: an agent that can already play every strategy before GRPO starts.

The base 135M model writes a direct ask in ~3% of its messages, so single-simulator training first
had to discover the strategy the collapsed simulator rewards before it could overfit it (docs/lab.md,
the first LLM result). The paper's agents start as instruction-tuned models that use every strategy;
this gives ours the same start:

1. **Data** (``warm_start_messages/<game>.jsonl`` beside this module, written for this lab): per strategy of the
   game, varied fundraiser messages that play it, each marked ``train`` or ``heldout`` (one in three).
   :func:`classifier_agreement` reports how often the lab's :class:`StrategyClassifier` places a
   message as its label, per split; the held-out part was written without looking at the patterns,
   so its agreement measures the classifier, not the writing.
2. **Examples** (:func:`sft_examples`): each message as the target of the agent's own chat at the
   point it would write it (the lab prompt and the user's opening line; for a third of them, a second
   turn after one earlier message and a non-terminal reply), the context built as ``LLMTurns`` builds
   it. Train messages the classifier does not place are left out (the fine-tune should teach
   messages that count); held-out messages are the validation examples.
3. **Fine-tune** (:func:`warm_start_model`): ``scope sft`` (the project's SFT path) on those examples
   with ``merge: true``, so the result is a model directory whose own weights are the warm-started
   policy. Every arm starts from it with a fresh LoRA adapter (B = 0: exactly the warm-started policy),
   and the learner's KL term, which scores the model with adapters off, anchors to it.
4. **Check** (:func:`first_message_shares`): the share of each strategy among sampled first messages.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from scope_marl.core.seeds import derive_seed
from scope_marl.core.types import Message, SamplingParams
from scope_marl.lab.classifier import OTHER, StrategyClassifier
from scope_marl.lab.games import Game
from scope_marl.lab.llm_agent import OPENING, REPLIES, SYSTEM_PROMPTS

DATA = Path(__file__).with_name("warm_start_messages")
SPLITS = ("train", "heldout")
SECOND_TURN_EVERY = 3  # one example in three is written at the second turn


@dataclass(frozen=True)
class Labelled:
    strategy: str
    text: str
    split: str


def labelled_messages(game: Game) -> list[Labelled]:
    """The game's warm-start messages, in file order; checked against the game's strategies."""
    path = DATA / f"{game.name}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no warm-start messages for lab game {game.name!r} ({path})")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            row = json.loads(line)
            if row["strategy"] not in game.strategies or row["split"] not in SPLITS:
                raise ValueError(f"{path}:{number}: strategy {row['strategy']!r} / split {row['split']!r} not of game {game.name!r}")
            rows.append(Labelled(row["strategy"], row["text"], row["split"]))
    return rows


def classifier_agreement(game: Game) -> dict[str, dict]:
    """Per split: the share of messages the classifier places as their label, overall and per strategy,
    and what the misplaced ones became."""
    classifier = StrategyClassifier(game.name, game.strategies)
    messages = labelled_messages(game)
    out = {}
    for split in SPLITS:
        rows = [r for r in messages if r.split == split]
        verdicts = [(r.strategy, classifier.classify(r.text)) for r in rows]
        per = {s: [v == s for label, v in verdicts if label == s] for s in game.strategies}
        confused: dict[str, int] = {}
        for label, v in verdicts:
            if v != label:
                confused[f"{label}->{v}"] = confused.get(f"{label}->{v}", 0) + 1
        out[split] = {
            "n": len(rows),
            "accuracy": sum(label == v for label, v in verdicts) / len(rows),
            "per_strategy": {s: sum(hits) / len(hits) for s, hits in per.items() if hits},
            "confusions": dict(sorted(confused.items(), key=lambda kv: -kv[1])),
        }
    return out


def _context(game: Game, earlier: str | None, reply: str | None) -> list[Message]:
    view = [Message(role="system", content=SYSTEM_PROMPTS[game.name]), Message(role="user", content=OPENING)]
    if earlier is not None:
        view += [Message(role="assistant", content=earlier), Message(role="user", content=reply)]
    return view


def sft_examples(game: Game, seed: int = 0) -> list[dict]:
    """``scope sft`` examples (context, target, split): train messages the classifier places, and every
    held-out message as validation."""
    classifier = StrategyClassifier(game.name, game.strategies)
    rows = labelled_messages(game)
    train = [r for r in rows if r.split == "train" and classifier.classify(r.text) == r.strategy]
    ongoing = [a for a, ends in zip(game.acts, game.terminal.tolist()) if not ends]  # replies after which the agent writes again
    rng = random.Random(seed)
    examples = []
    for k, row in enumerate(r for r in rows if r.split == "heldout" or r in train):
        earlier = reply = None
        if k % SECOND_TURN_EVERY == SECOND_TURN_EVERY - 1:
            earlier = rng.choice([r.text for r in train if r.text != row.text])
            reply = rng.choice(REPLIES[rng.choice(ongoing)])
        context = _context(game, earlier, reply)
        examples.append(
            {
                "context": [m.model_dump() for m in context],
                "target": row.text,
                "split": "train" if row.split == "train" else "validation",
            }
        )
    return examples


def first_message_shares(
    chat, game: Game, n: int = 256, seed: int = 0, max_new_tokens: int = 32, temperature: float = 0.7, adapter: str | None = None
) -> dict:
    """The agent's first message sampled ``n`` times (on ``adapter``, None: the model's own weights):
    each strategy's share, ``other`` included, and a few of the messages."""
    classifier = StrategyClassifier(game.name, game.strategies)
    prompt = chat.encode_chat(_context(game, None, None), add_generation_prompt=True)
    sampling = SamplingParams(temperature=temperature, top_p=1.0, max_new_tokens=max_new_tokens)
    adapters = [adapter] * n if adapter is not None else None
    texts = [g.text for g in chat.generate_ids([prompt] * n, sampling, adapters=adapters, seeds=[derive_seed(seed, i) for i in range(n)])]
    labels = [classifier.classify(t) for t in texts]
    return {name: labels.count(name) / n for name in [*game.strategies, OTHER]} | {"n": n, "examples": texts[:8]}


def warm_start_model(game: Game, folder: Path, lr: float, epochs: float, seed: int = 0, model: str = "embedded", log=print) -> Path:
    """``folder/sft/model``: the embedded model fine-tuned on the game's warm-start examples (``scope sft``
    with ``merge: true``, run in ``folder/sft``; resumed if it was cut short, reused once made)."""
    from scope_marl.config import SFTConfig
    from scope_marl.core import files
    from scope_marl.training.sft import resume_sft, start_sft

    run_dir = Path(folder) / "sft"
    merged = run_dir / "model"
    if (merged / "config.json").is_file():
        return merged
    if run_dir.is_dir() and (run_dir / "config.yaml").is_file():
        run = resume_sft(run_dir, log)
    else:
        examples = files.write_text(Path(folder) / "examples.jsonl", "".join(json.dumps(e) + "\n" for e in sft_examples(game, seed)))
        cfg = SFTConfig.model_validate(
            {
                "model": model,
                "examples": str(examples),
                "merge": True,
                "lora": {"r": 16, "alpha": 32},
                "lr": lr,
                "batch_size": 8,
                "epochs": epochs,
                "eval_every": 0,
                "checkpoint_every": 10,
                "seed": seed,
            }
        )
        run = start_sft(cfg, run_dir)
    records = run.run(progress=False)
    if records:
        log(f"[warm start {game.name}] {len(records)} SFT steps, validation loss {records[-1].get('val_loss', float('nan')):.3f}")
    return merged
