"""``scope plan``: the planner against the measured peak resident set of real ``scope train`` runs on the
CPU, the arithmetic behind it (LoRA counts, key/value bytes, saved activations), the fixes and the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch
import yaml
from transformers import LlamaConfig, LlamaForCausalLM
from typer.testing import CliRunner

from scope_marl.cli import app
from scope_marl.config import TrainConfig
from scope_marl.training import plan as planner

runner = CliRunner()
TOLERANCE = 0.15


def save_random_llama(path, tokenizer, hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """A random Llama with the SmolLM2 vocabulary saved as ``hf:PATH`` (weights drawn in place: no slow
    default init). Its near-uniform next-token distribution makes every turn run to max_new_tokens, so a
    run plays exactly the episodes a plan bounds."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device="cpu")
    model.tie_weights()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0) if "norm" in name else p.normal_(0.0, 0.02, generator=generator)
    model.model.rotary_emb.__init__(config=config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizer) -> dict[str, str]:
    """66M parameters (264 MB in fp32: weights, their packed copies and full fine-tuning's copies are most of
    a run), and 22M with wide key/value heads (a rollout's cache and a long micro-batch are most of it)."""
    root = tmp_path_factory.mktemp("plan-models")
    save_random_llama(root / "m66", tokenizer, hidden=640, intermediate=1728, layers=8, heads=10, kv_heads=2, head_dim=64)
    save_random_llama(root / "m22", tokenizer, hidden=256, intermediate=1024, layers=8, heads=8, kv_heads=4, head_dim=64)
    return {"m66": f"hf:{root / 'm66'}", "m22": f"hf:{root / 'm22'}"}


def run_config(model: str, **overrides) -> dict:
    base = {
        "model": model,
        "env": {"name": "say_the_word", "num_tasks": 8, "max_exchanges": 2},
        "agent_sampling": {"temperature": 1.0, "max_new_tokens": 8},
        "simulator": {"mode": "frozen", "model": model, "sampling": {"temperature": 1.0, "max_new_tokens": 8}},
        "lora": {"r": 16, "alpha": 32, "target_modules": ["q_proj", "v_proj"]},
        "learner": {"lr": 1e-4, "kl_coef": 0.01},
        "rollout": {"group_size": 4, "max_concurrent": 16, "on_turn_limit": "continue", "on_empty_reply": "keep", "progress": False},
        "tasks_per_step": 2,
        "steps": 1,
        "eval": {"every": 0},
        "seed": 0,
        "threads": 1,  # three runs share the machine's cores
        "hardware": {"device": "cpu"},
    }
    base.update(overrides)
    return base


def three_runs(models: dict[str, str]) -> dict[str, dict]:
    m66, m22 = models["m66"], models["m22"]
    sim66 = {"model": m66, "sampling": {"temperature": 1.0, "max_new_tokens": 8}}
    sim22 = {"mode": "frozen", "model": m22, "sampling": {"temperature": 1.0, "max_new_tokens": 24}}
    return {
        "lora_cotrain": run_config(m66, simulator={"mode": "trainable", **sim66}, trainable_roles=["agent", "user"]),
        "full_finetune": run_config(m66, finetune="full", simulator={"mode": "frozen", **sim66}),
        "long_batch": run_config(
            m22,
            env={"name": "say_the_word", "num_tasks": 8, "max_exchanges": 3},
            agent_sampling={"temperature": 1.0, "max_new_tokens": 24},
            simulator=sim22,
            learner={"lr": 1e-4, "kl_coef": 0.01, "token_budget": 8192},
            tasks_per_step=4,
        ),
    }


# The run is started by a small Python process, not by pytest: a child's ru_maxrss counts the memory of the
# process it was forked from until it execs (pytest's own gigabytes late in a full suite).
MEASURE = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(child.pid, 0)
print("MEASURED", usage.ru_maxrss, usage.ru_utime + usage.ru_stime, flush=True)
sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.integration
def test_plans_match_the_measured_peak_rss_of_three_cpu_training_runs(models, tmp_path, capsys):
    """Each config planned, then trained for one step by ``scope train`` in its own process (the three at
    once); the plan's total is within 15% of the run's peak resident set (``wait4``'s ru_maxrss)."""
    configs = three_runs(models)
    # Planned first: a run stores the machine's packed-weight choice, and the plan must see what the run did.
    planned = {name: planner.plan_run(TrainConfig.model_validate(cfg)) for name, cfg in configs.items()}
    started = time.perf_counter()
    children = {}
    for name, cfg in configs.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        command = [sys.executable, "-c", MEASURE, sys.executable, "-m", "scope_marl.cli", "train", str(path), "--out", str(tmp_path / name)]
        children[name] = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
    measured, cpu_seconds = {}, 0.0
    for name, child in children.items():
        output = child.communicate()[0].decode(errors="replace")
        assert child.returncode == 0, f"{name}: scope train failed:\n{output}"
        maxrss_kib, cpu = output.rsplit("MEASURED ", 1)[1].split()
        measured[name] = int(maxrss_kib) * 1024 / planner.GIB
        cpu_seconds += float(cpu)
    seconds = time.perf_counter() - started
    lines = []
    for name, plan in planned.items():
        total = plan.total / planner.GIB
        error = (total - measured[name]) / measured[name]
        lines.append(f"{name}: planned {total:.3f} GiB, measured {measured[name]:.3f} GiB, {error:+.1%}")
    with capsys.disabled():
        print(f"\nplan vs measured peak RSS (the three runs: {seconds:.0f} s, {cpu_seconds:.0f} CPU s):\n  " + "\n  ".join(lines))
    for name, plan in planned.items():
        assert abs(plan.total / planner.GIB - measured[name]) / measured[name] <= TOLERANCE, lines
    # The model is a real share of each: not the runtime's baseline with a rounding error on top.
    for name, plan in planned.items():
        assert plan.total - plan.phase_bytes("baseline") > 0.35 * plan.total, name


# ---- arithmetic ---------------------------------------------------------------------------------------
def tiny_config(tokenizer, **extra) -> LlamaConfig:
    fields = {
        "vocab_size": len(tokenizer),
        "hidden_size": 192,
        "intermediate_size": 688,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "tie_word_embeddings": True,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    return LlamaConfig(**{**fields, **extra})


def test_lora_and_base_counts_agree_with_peft_on_a_real_model(tokenizer):
    from peft import LoraConfig, get_peft_model

    config = tiny_config(tokenizer)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    adapters = {"agent": LoraConfig(r=8, lora_alpha=16, target_modules=targets), "simulator": LoraConfig(r=4, target_modules=["q_proj"])}
    arch = planner.architecture(config, adapters)
    torch.manual_seed(0)
    real = LlamaForCausalLM(config)
    assert arch.base_params == sum(p.numel() for p in real.parameters())
    assert arch.largest_param == real.model.embed_tokens.weight.numel()
    model = get_peft_model(real, adapters["agent"], adapter_name="agent")
    assert arch.lora_params["agent"] == model.get_nb_trainable_parameters()[0]
    model.add_adapter("simulator", adapters["simulator"])
    both = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    assert arch.lora_params["agent"] + arch.lora_params["simulator"] == both
    # Per layer: seven rank-8 modules; inputs q, k, v, gate, up 192 wide, o_proj 8 x 32, down_proj 688.
    assert arch.lora_ranks["agent"] == 7 * 8 and arch.lora_inputs["agent"] == 5 * 192 + 256 + 688


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_bytes_per_token_are_the_row_caches(tokenizer, dtype):
    from scope_marl.backends.kv_cache import RowCache

    arch = planner.architecture(tiny_config(tokenizer, num_key_value_heads=4), {})
    cache = RowCache(arch.layers, arch.kv_heads, arch.head_dim, dtype, "cpu", compiled=False)
    assert arch.kv_bytes_per_token(dtype.itemsize) == cache.bytes_per_column == 2 * 4 * 4 * 32 * dtype.itemsize


def test_counted_activations_are_what_autograd_saves(tokenizer):
    """The per-token, per-layer count (module docstring) against the bytes autograd really saves in one
    ``Learner._score`` with a LoRA adapter: unique storages seen by saved_tensors_hooks, weights excluded."""
    from peft import LoraConfig

    from scope_marl.backends.hf import HFChatModel
    from scope_marl.config.train import LearnerConfig
    from scope_marl.core.types import RoleStream
    from scope_marl.training.learner import Learner

    config = tiny_config(tokenizer, hidden_size=192, intermediate_size=560, num_attention_heads=6, num_key_value_heads=3)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=targets)
    torch.manual_seed(0)
    chat = HFChatModel(LlamaForCausalLM(config), tokenizer)
    chat.add_adapter("agent", lora)
    learner = Learner(chat, "agent", "agent", 1.0, LearnerConfig(kl_coef=0.0))
    prompt_len, response_len, group, groups = 60, 90, 4, 2
    streams = []
    for g in range(groups):
        prompt = torch.randint(10, 1000, (prompt_len,), generator=torch.Generator().manual_seed(g)).tolist()
        for i in range(group):
            ids = torch.randint(10, 1000, (response_len,), generator=torch.Generator().manual_seed(100 + 10 * g + i)).tolist()
            n = len(ids)
            streams.append(
                RoleStream(role="agent", prompt_ids=prompt, response_ids=ids, loss_mask=[1] * n, logprobs=[0.0] * n, entropies=[0.0] * n)
            )
    weights = {p.untyped_storage().data_ptr() for p in chat.model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = max(saved.get(storage.data_ptr(), 0), storage.nbytes())
        return t

    chat.model.set_adapter("agent")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        learner._score(streams, chat.model)
    arch = planner.architecture(config, {"agent": lora})
    tokens = planner.RoleTokens(prompt=prompt_len, response=response_len, turn_requests=())
    shape = planner.ScoringShape(arch, (group * groups, groups), tokens, 4, True, "agent")
    counted, measured = shape.policy(False).saved, sum(saved.values())
    assert abs(counted - measured) / measured < 0.03, (counted, measured)


# ---- fixes and the command ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_config(tmp_path_factory, tiny_model_dir) -> str:
    """A co-training config on the 2-layer test model, with a long micro-batch (activations dominate)."""
    model = f"hf:{tiny_model_dir}"
    cfg = run_config(
        model, simulator={"mode": "trainable", "model": model, "sampling": {"max_new_tokens": 48}}, trainable_roles=["agent", "user"]
    )
    cfg.update(agent_sampling={"max_new_tokens": 48}, tasks_per_step=8, learner={"token_budget": 8192})
    cfg["env"]["max_exchanges"] = 4
    path = tmp_path_factory.mktemp("plan-config") / "small.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_a_plan_that_does_not_fit_names_the_least_change_that_does(small_config):
    from scope_marl.config import load_config

    cfg = load_config(small_config, TrainConfig)
    facts = planner.gather(cfg)
    plan = planner.estimate(facts, planner.knobs_of(facts))
    with_checkpointing = planner.estimate(
        facts, planner.knobs_of(facts).__class__(**{**vars(planner.knobs_of(facts)), "gradient_checkpointing": True})
    )
    assert with_checkpointing.total < plan.total
    between = (with_checkpointing.total + plan.total) / 2 / planner.GIB
    result = runner.invoke(app, ["plan", small_config, "--memory", f"{between:.4f}"])
    assert result.exit_code == 0, result.output
    assert "does not fit; to fit: learner.gradient_checkpointing: true" in result.output
    assert result.output.strip().splitlines()[-1] == f"RESULT plan_total_gib={plan.total / planner.GIB:.3f} fits=false"
    # Below what checkpointing alone saves, the next levers follow in order.
    tight = planner.plan_run(cfg, memory_gib=with_checkpointing.total / planner.GIB * 0.99)
    assert not tight.fits and tight.fix.startswith("learner.gradient_checkpointing: true; ")
    assert "token_budget" in tight.fix or "max_concurrent" in tight.fix


def test_the_command_prints_a_table_and_writes_the_same_numbers_as_json(small_config, tmp_path):
    import json

    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["plan", small_config, "--memory", "64", "--json", str(out)])
    assert result.exit_code == 0, result.output
    numbers = json.loads(out.read_text())
    assert numbers["fits"] is True and numbers["device"] == "cpu" and numbers["capacity_gib"] == 64
    assert result.output.strip().splitlines()[-1] == f"RESULT plan_total_gib={numbers['plan_total_gib']:.3f} fits=true"
    names = {p["name"] for p in numbers["parts"]}
    assert {"base weights", "LoRA AdamW moments (2 x fp32)", "KV cache (rollout)"} <= names
    assert any(name.startswith("activations kept") for name in names)


def test_a_gpu_plan_shards_full_fine_tuning_over_the_ranks(small_config):
    """No GPU needed: ``--gpus`` with ``device: auto`` plans CUDA in bfloat16; FSDP2 splits the agent's
    float32 master weights, gradients and moments over the ranks."""
    from scope_marl.config import load_config

    fields = load_config(small_config, TrainConfig).model_dump()
    fields.update(finetune="full", trainable_roles=["agent"], hardware={"device": "auto", "parallel": "fsdp"})
    cfg = TrainConfig.model_validate({**fields, "simulator": {"mode": "frozen", "model": fields["model"]}})
    one, four = (planner.plan_run(cfg, gpus=n, gpu_memory_gib=80) for n in (1, 4))
    assert one.device == "cuda" and one.dtype == "bfloat16"
    master = {p.name: p.bytes for p in one.parts}["agent master weights (fp32, sharded)"]
    assert {p.name: p.bytes for p in four.parts}["agent master weights (fp32, sharded)"] == pytest.approx(master / 4, abs=1)
    assert four.phase_bytes("persistent") < one.phase_bytes("persistent")
    lora = TrainConfig.model_validate({**cfg.model_dump(), "finetune": "lora"})
    with pytest.raises(planner.PlanError, match="fsdp shards a fully fine-tuned agent"):
        planner.plan_run(lora, gpus=2)


def test_errors_are_a_few_lines_without_a_traceback(tmp_path, tiny_model_dir):
    bad_field = tmp_path / "bad.yaml"
    bad_field.write_text(yaml.safe_dump({"model": f"hf:{tiny_model_dir}", "learner": {"token_budgte": 10}}))
    unknown_model = tmp_path / "unknown.yaml"
    unknown_model.write_text(yaml.safe_dump({"model": "nonsense:x"}))
    cpu_with_gpus = tmp_path / "cpu.yaml"
    cpu_with_gpus.write_text(yaml.safe_dump({"model": f"hf:{tiny_model_dir}", "hardware": {"device": "cpu"}}))
    for path, args, message in (
        (bad_field, [], "token_budgte"),
        (unknown_model, [], "unknown model spec 'nonsense:x'"),
        (cpu_with_gpus, ["--gpus", "2"], "hardware.device is cpu"),
        (tmp_path / "missing.yaml", [], "does not exist"),
    ):
        result = runner.invoke(app, ["plan", str(path), *args])
        assert result.exit_code == 2, result.output
        assert message in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) <= 12


def test_a_colocated_vllm_server_gets_what_the_planned_learner_leaves(tmp_path):
    """scope serve vllm --colocate CONFIG: the GPU share is (capacity - the learner's plan - 1 GiB headroom) /
    capacity, passed to vLLM as --gpu-memory-utilization; a learner that leaves less than a tenth is refused."""
    from pathlib import Path

    from scope_marl.backends import vllm_server as vs
    from scope_marl.config import TrainConfig
    from scope_marl.training.plan import GIB, PlanError, plan_run, sampler_share

    cfg = TrainConfig.model_validate({"model": "embedded", "hardware": {"device": "auto"}})
    plan = plan_run(cfg, gpus=1, gpu_memory_gib=80)
    share = sampler_share(cfg, gpu_memory_gib=80)
    assert share == pytest.approx((80 * GIB - plan.total - GIB) / (80 * GIB), abs=1e-3) and 0.5 < share < 0.99
    command = vs.server_command(Path("python"), Path("w"), "m", "127.0.0.1", 8001, "cuda", 16, 4, 2048, share)
    assert command[command.index("--gpu-memory-utilization") + 1] == f"{share:g}"
    with pytest.raises(PlanError, match="leaving a colocated vLLM server"):
        sampler_share(cfg, gpu_memory_gib=plan.total / GIB + 0.5)
