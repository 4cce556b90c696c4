"""scope sft on a file of chat examples (any role, no corpus needed), and its merged export: a model
directory whose own weights are the fine-tuned policy (what the LLM lab's agent warm start and KL
anchor use)."""

from __future__ import annotations

import json

import pytest
import torch

from scope_marl.backends import load_backend
from scope_marl.config import SFTConfig
from scope_marl.core.types import Message
from scope_marl.training.sft import example_turns, start_sft

SYSTEM = {"role": "system", "content": "You are a fundraiser for a charity."}


def write_examples(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_sft_on_chat_examples_exports_a_merged_model_that_is_the_fine_tuned_policy(tiny_model_dir, tmp_path):
    targets = ["Please donate five dollars today.", "Would you give a dollar now?", "Every dollar buys a meal."]
    rows = [{"context": [SYSTEM, {"role": "user", "content": f"Hi {i}"}], "target": targets[i % 3], "split": "train"} for i in range(8)]
    rows += [{"context": [SYSTEM, {"role": "user", "content": "Hello"}], "target": t, "split": "validation"} for t in targets[:2]]
    examples = write_examples(tmp_path / "examples.jsonl", rows)
    assert [t.target for t in example_turns(examples, "validation")] == targets[:2]
    cfg = SFTConfig.model_validate(
        {
            "model": f"hf:{tiny_model_dir}",
            "examples": str(examples),
            "merge": True,
            "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
            "lr": 0.05,
            "batch_size": 4,
            "epochs": 3,
            "eval_every": 0,
            "threads": 1,
        }
    )
    run = start_sft(cfg, tmp_path / "run")
    before = run.validation_loss()
    records = run.run(progress=False)
    assert records[-1]["val_loss"] < before
    merged = load_backend(f"hf:{tmp_path / 'run' / 'model'}")
    with_adapter = load_backend(f"hf:{tiny_model_dir}")
    with_adapter.add_adapter("sft", str(tmp_path / "run" / "adapter"))
    ids = torch.tensor([merged.encode_chat([Message(**SYSTEM), Message(role="user", content="Hi")], add_generation_prompt=True)])
    with torch.no_grad():
        a, b = merged.model(ids).logits, with_adapter.model(ids).logits
        base = load_backend(f"hf:{tiny_model_dir}").model(ids).logits
    assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()
    assert (a - base).abs().max() > 1e-3  # the fine-tune moved the policy, and the merged weights carry it


def test_a_bad_examples_file_names_the_line(tmp_path):
    path = write_examples(tmp_path / "bad.jsonl", [{"context": [SYSTEM], "target": "x", "split": "train"}, {"target": "y"}])
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: not a chat example"):
        example_turns(path, "train")
    path = write_examples(tmp_path / "bad2.jsonl", [{"context": [{"role": "tool", "content": "x"}], "target": "x", "split": "train"}])
    with pytest.raises(ValueError, match=r"bad2\.jsonl:1: context role 'tool'"):
        example_turns(path, "train")
