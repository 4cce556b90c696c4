"""scope sft: examples built as the environment builds the persuadee's chat, the loss on the human's
tokens only, splits respected, exact resume, and the adapter as a simulator everywhere one is named."""

from __future__ import annotations

import json

import pytest
import torch

from scope_marl.config import SFTConfig
from scope_marl.envs import USER
from scope_marl.envs.p4g import PersuasionForGood
from scope_marl.envs.p4g.corpus import find_corpus_dir

CORPUS = find_corpus_dir(required=False)
pytestmark = pytest.mark.skipif(CORPUS is None, reason="P4G corpus not found (set SCOPE_P4G_DIR or place it at ../shared/data/p4g)")


@pytest.fixture(scope="module")
def env():
    return PersuasionForGood(source="corpus")


def sft_config(model_dir, **overrides) -> SFTConfig:
    base = {
        "model": f"hf:{model_dir}",
        "env": {"name": "p4g", "source": "corpus"},
        "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "lr": 0.01,
        "batch_size": 4,
        "max_train_turns": 24,
        "max_val_turns": 12,
        "epochs": 1,
        "eval_every": 0,
        "checkpoint_every": 2,
        "threads": 1,
    }
    return SFTConfig.model_validate({**base, **overrides})


def test_an_example_is_the_persuadees_chat_and_the_loss_covers_only_the_human_turn(env, tiny_chat):
    from scope_marl.core.types import Message
    from scope_marl.training.learner import Learner
    from scope_marl.training.sft import encode, persuadee_turns

    turns = persuadee_turns(env, "train")
    turn = next(t for t in turns if len(t.context) >= 3)
    task = next(t for t in env.tasks("train") if t.task_id == turn.dialogue_id)
    assert turn.context[0] == Message(role="system", content=env.system_prompt(task, USER)), "the environment's persuadee prompt"
    assert turn.context[-1].role == "user", "the persuader's last message, as the simulator sees it"
    stream = encode(tiny_chat, turn)
    assert tiny_chat.decode(stream.response_ids) == turn.target + "<|im_end|>"
    assert stream.loss_mask == [1] * len(stream.response_ids)
    whole = tiny_chat.encode_chat([*turn.context, Message(role="assistant", content=turn.target)], add_generation_prompt=False)
    assert whole[: len(stream.prompt_ids) + len(stream.response_ids)] == stream.prompt_ids + stream.response_ids

    from peft import LoraConfig

    tiny_chat.add_adapter("simulator", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    learner = Learner(tiny_chat, USER, "simulator", 1.0)
    with torch.no_grad():  # by hand: cross-entropy of the response tokens given everything before them
        ids = torch.tensor([stream.prompt_ids + stream.response_ids])
        logits = tiny_chat.model(input_ids=ids).logits[0].double()
        start = len(stream.prompt_ids)
        logp = torch.log_softmax(logits[start - 1 : -1], -1).gather(-1, ids[0, start:, None]).squeeze(-1)
    assert learner.supervised_loss([stream]) == pytest.approx(float(-logp.mean()), rel=1e-4)


@pytest.mark.integration
def test_no_validation_or_test_dialogue_reaches_training(env, tiny_model_dir, tmp_path):
    from scope_marl.training.sft import persuadee_turns, start_sft

    split = {name: {t.task_id for t in env.tasks(name)} for name in ("train", "validation", "test")}
    every = persuadee_turns(env, "train", horizon=5)
    assert {t.dialogue_id for t in every} <= split["train"] and len({t.dialogue_id for t in every}) > 500
    assert max(sum(m.role == "assistant" for m in t.context) for t in every) == 4, "a dialogue's first 5 persuadee turns"
    assert len(persuadee_turns(env, "train")) > len(every)
    run = start_sft(sft_config(tiny_model_dir, max_train_turns=None, max_val_turns=50), tmp_path / "run")
    try:
        trained = {t.dialogue_id for t in run.train_turns}
        assert trained == {t.dialogue_id for t in every} and not trained & (split["validation"] | split["test"])
        assert {t.dialogue_id for t in run.val_turns} <= split["validation"]
        assert run.train_dialogues == len(trained)
    finally:
        run.close()


@pytest.mark.integration
def test_sft_lowers_the_loss_and_resumes_exactly(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    from scope_marl.training.sft import resume_sft, start_sft

    cfg = sft_config(tiny_model_dir, eval_every=2)
    straight = start_sft(cfg, tmp_path / "straight")
    before = straight.validation_loss()
    records = straight.run(progress=False)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6] and straight.steps == 6
    val = [r["val_loss"] for r in records if "val_loss" in r]
    assert len(val) == 3 and val[-1] < before  # at steps 2, 4, 6 (eval_every 2)

    interrupted = start_sft(cfg, tmp_path / "resumed")
    for _ in range(3):
        interrupted.train_step()  # checkpoint at step 2; step 3's metric line is dropped on resume
    interrupted.close()
    messages = []
    resumed = resume_sft(tmp_path / "resumed", log=messages.append)
    assert resumed.step == 2
    resumed.run(progress=False)

    def metrics(run):
        return [{k: v for k, v in json.loads(line).items() if k != "step_s"} for line in (tmp_path / run / "metrics.jsonl").open()]

    assert metrics("resumed") == metrics("straight")
    a = load_file(tmp_path / "straight" / "adapter" / "adapter_model.safetensors")
    b = load_file(tmp_path / "resumed" / "adapter" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def sft_adapter(tiny_model_dir, tmp_path_factory):
    from scope_marl.training.sft import start_sft

    out = tmp_path_factory.mktemp("sft")
    start_sft(sft_config(tiny_model_dir, max_train_turns=8), out / "run").run(progress=False)
    return out / "run" / "adapter"


def test_the_sft_adapter_is_a_frozen_simulator_a_pool_member_and_a_co_training_start(tiny_model_dir, sft_adapter, tmp_path):
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    from scope_marl.assembly import ModelCache, build_simulator
    from scope_marl.config import FrozenSimulatorConfig, PoolSimulatorConfig, TrainConfig
    from scope_marl.core.types import Message
    from scope_marl.experiment import start
    from scope_marl.simulators.base import SimulatorTurn
    from scope_marl.simulators.pool import SimulatorPool

    saved = load_file(sft_adapter / "adapter_model.safetensors")
    models = ModelCache()
    frozen = build_simulator(FrozenSimulatorConfig(model=f"hf:{tiny_model_dir}", adapter=str(sft_adapter)), models)
    model = models.get(f"hf:{tiny_model_dir}")
    name = frozen.seat.adapter
    assert name.startswith("file-") and name in model.adapters
    held = get_peft_model_state_dict(model.model, adapter_name=name)
    assert all(torch.equal(held[k], v) for k, v in saved.items())
    chat = [Message(role="system", content="You are a persuadee."), Message(role="user", content="Would you donate $1?")]
    turn = SimulatorTurn(episode_id="e#0/0", task=None, context=chat)
    assert len(frozen.respond([turn])) == 1

    pool = SimulatorPool(tmp_path / "pool")
    member = pool.add(sft_adapter, step=0, base=True)
    population = build_simulator(PoolSimulatorConfig(mode="pool", root=str(tmp_path / "pool"), model=f"hf:{tiny_model_dir}"), ModelCache())
    assert population.for_group(0).simulator_id.startswith(f"pool:{member.member_id}@")
    assert len(population.for_group(0).respond([turn])) == 1

    sim = {"mode": "trainable", "model": f"hf:{tiny_model_dir}", "init": str(sft_adapter)}
    cfg = {
        "model": f"hf:{tiny_model_dir}",
        "simulator": sim,
        "trainable_roles": ["agent", "user"],
        "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "steps": 1,
    }
    trainer = start(TrainConfig.model_validate(cfg), tmp_path / "cotrain")
    try:
        started = trainer.chat.adapter_tensors("simulator")
        assert started.keys() == saved.keys() and all(torch.equal(started[k], v) for k, v in saved.items())
    finally:
        trainer.close()


def test_scope_eval_humans_compares_donations_and_diversity(tmp_path):
    from typer.testing import CliRunner

    from scope_marl.cli import app
    from scope_marl.evaluation.humans import histogram, total_variation

    assert histogram([0.0, 0.5, 1.0, 2.0, 3.0, 0.25]) == pytest.approx([1 / 6, 2 / 6, 1 / 6, 2 / 6])
    assert total_variation([1, 0, 0, 0], [0, 0, 0, 1]) == 1.0
    args = ["eval", "--model", "scripted:Would you give $1 to Save the Children?", "--tasks", "6", "--out", str(tmp_path)]
    args += ["--humans", "giver=frozen:scripted:Sure. [DONATE $2]", "--humans", "refuser=frozen:scripted:No thanks, I keep my money."]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "humans.json").read_text())
    human = results["humans"]["histogram"]
    assert results["tasks"] == 6 and sum(human) == pytest.approx(1.0)
    giver, refuser = results["simulators"]["giver"], results["simulators"]["refuser"]
    assert giver["histogram"] == [0, 0, 0, 1] and refuser["histogram"] == [1, 0, 0, 0]
    assert giver["donation_tv"] == pytest.approx(1 - human[3]) and refuser["donation_tv"] == pytest.approx(1 - human[0])
    assert giver["mean_donation"] == 2.0 and refuser["mean_donation"] == 0.0
    # One repeated reply: its 5 bigrams over every turn; the humans' turns vary.
    refusals = 3 * 6  # max_exchanges 3, no donation tag ends the dialogue early
    assert refuser["distinct2"] == pytest.approx(5 / (5 * refusals)) and results["humans"]["distinct2"] > 0.5
    assert "humans (corpus)" in result.output


@pytest.mark.integration
def test_full_fine_tuning_exports_a_model_directory_that_plays_the_user(tiny_model_dir, tmp_path):
    from scope_marl.assembly import ModelCache, build_simulator
    from scope_marl.backends import load_backend
    from scope_marl.config import FrozenSimulatorConfig
    from scope_marl.training.sft import start_sft

    run = start_sft(sft_config(tiny_model_dir, finetune="full", max_train_turns=8, lr=1e-3), tmp_path / "run")
    run.run(progress=False)
    base, tuned = load_backend(f"hf:{tiny_model_dir}"), load_backend(f"hf:{tmp_path / 'run' / 'model'}")
    assert not tuned.adapters and base.model.state_dict().keys() == tuned.model.state_dict().keys()
    assert any(not torch.equal(v, tuned.model.state_dict()[k]) for k, v in base.model.state_dict().items())
    from scope_marl.core.types import Message
    from scope_marl.simulators.base import SimulatorTurn

    simulator = build_simulator(FrozenSimulatorConfig(model=f"hf:{tmp_path / 'run' / 'model'}"), ModelCache())
    chat = [Message(role="system", content="You are a persuadee."), Message(role="user", content="Would you donate $1?")]
    (reply,) = simulator.respond([SimulatorTurn(episode_id="e#0/0", task=None, context=chat)])
    assert isinstance(reply, str) and (tmp_path / "run" / "checkpoints" / "step-000002" / "weights").is_dir()
