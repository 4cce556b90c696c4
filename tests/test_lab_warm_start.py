"""The LLM lab's warm start (lab/warm_start.py): its strategy messages, the classifier's agreement with
their labels, the SFT examples built as the agent's own chat, and the fine-tune through scope sft to a
merged model that starts every arm."""

from __future__ import annotations

import pytest

from scope_marl.backends import load_backend
from scope_marl.lab.classifier import OTHER, StrategyClassifier
from scope_marl.lab.games import load_game
from scope_marl.lab.llm_agent import OPENING, SYSTEM_PROMPTS
from scope_marl.lab.warm_start import classifier_agreement, first_message_shares, labelled_messages, sft_examples, warm_start_model


@pytest.mark.parametrize(("name", "per_strategy"), [("theory", 60), ("p4g", 30)])
def test_every_strategy_has_train_and_heldout_messages_and_every_train_message_is_placed(name, per_strategy):
    game = load_game(name)
    rows = labelled_messages(game)
    assert len({r.text for r in rows}) == len(rows)  # no duplicates
    for strategy in game.strategies:
        mine = [r for r in rows if r.strategy == strategy]
        assert len(mine) == per_strategy and sum(r.split == "heldout" for r in mine) == per_strategy // 3
    agreement = classifier_agreement(game)
    assert agreement["train"]["accuracy"] == 1.0
    assert 0.0 < agreement["heldout"]["accuracy"] < 1.0 and agreement["heldout"]["n"] == len(game.strategies) * per_strategy // 3
    assert all(label.split("->")[0] in game.strategies for label in agreement["heldout"]["confusions"])


def test_examples_are_the_agents_own_chat_at_the_first_or_second_turn():
    game = load_game("theory")
    examples = sft_examples(game)
    classifier = StrategyClassifier("theory", game.strategies)
    train = [e for e in examples if e["split"] == "train"]
    assert len(train) == 120 and len(examples) - len(train) == 60
    assert all(e["context"][0] == {"role": "system", "content": SYSTEM_PROMPTS["theory"]} for e in examples)
    assert all(e["context"][1] == {"role": "user", "content": OPENING} for e in examples)
    second = [e for e in examples if len(e["context"]) == 4]
    assert len(second) == len(examples) // 3 and all(e["context"][2]["role"] == "assistant" for e in second)
    assert all(classifier.classify(e["target"]) != OTHER for e in train)
    assert sft_examples(game) == examples  # seeded


def test_the_warm_start_fine_tunes_through_scope_sft_to_a_merged_model_made_once(tiny_model_dir, tmp_path):
    game = load_game("theory")
    said = []
    model = warm_start_model(game, tmp_path / "ws", lr=1e-3, epochs=0.2, model=f"hf:{tiny_model_dir}", log=said.append)
    assert (model / "config.json").is_file() and any("SFT steps" in line for line in said)
    assert (tmp_path / "ws" / "sft" / "config.yaml").is_file() and (tmp_path / "ws" / "examples.jsonl").is_file()  # a scope sft run
    again = warm_start_model(game, tmp_path / "ws", lr=1e-3, epochs=0.2, model=f"hf:{tiny_model_dir}", log=said.append)
    assert again == model and sum("SFT steps" in line for line in said) == 1  # made once, then reused
    shares = first_message_shares(load_backend(f"hf:{model}"), game, n=8, max_new_tokens=4)
    assert shares["n"] == 8 and sum(shares[k] for k in [*game.strategies, OTHER]) == pytest.approx(1.0)
