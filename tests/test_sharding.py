"""FSDP2 sharding of a fully fine-tuned agent (training.sharding), on the CPU with gloo ranks.

The sharded learner must give the update the unsharded one gives: gradients summed over ranks (not
averaged), float32 master weights, checkpoints written shard by shard with torch.distributed.checkpoint
and loadable by another number of ranks."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch
import yaml
from test_trainer import comparable, config

from scope_marl.config import TrainConfig
from scope_marl.core import run_layout
from scope_marl.experiment import start

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="gloo process groups are tested on Linux")


def full_ft_config(model_dir, **hardware) -> dict:
    # Greedy turns: a rank's batch has another shape than one process's, and on a random model's flat
    # distributions that can flip a sampled token; argmax does not flip, so both runs play the same episodes.
    # Greedy groups have equal rewards: the entropy bonus is what moves the weights (and its gradient is exact).
    greedy = {"temperature": 0.0, "max_new_tokens": 6}
    return config(
        model_dir,
        finetune="full",
        agent_sampling=greedy,
        simulator={"mode": "frozen", "model": f"hf:{model_dir}", "sampling": greedy},
        learner={"lr": 0.001, "kl_coef": 0.01, "entropy_coef": 0.05, "token_budget": 64},
        eval={"every": 0},
        rollout={"group_size": 2, "max_concurrent": 16, "on_turn_limit": "continue", "on_empty_reply": "keep", "progress": False},
        steps=2,
        checkpoint_every=1,
        tasks_per_step=4,
        hardware={"device": "cpu", **hardware},
    )


def torchrun(nproc: int, *args: str) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1"]
    done = subprocess.run(
        [*launcher, "--master-port", str(port), "-m", "scope_marl.cli", "train", *args],
        env={**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def metrics(run) -> list[dict]:
    return [comparable(json.loads(line)) for line in (run / run_layout.METRICS).read_text().splitlines()]


@pytest.mark.integration
@pytest.mark.slow
def test_fsdp2_on_two_gloo_ranks_trains_as_one_process_and_resumes_on_one_rank(tiny_model_dir, tmp_path):
    """torchrun with hardware.parallel: fsdp on 2 CPU ranks: every loss, gradient norm and entropy of two
    full fine-tuning steps within 1e-5 of one unsharded process (an averaged instead of summed gradient
    would halve the norm); checkpoints hold per-rank shards; a resume on ONE rank (a world of one, still
    through fully_shard) from step 1 plays step 2 as the two ranks did."""
    cfg = full_ft_config(tiny_model_dir, parallel="fsdp")
    path = tmp_path / "fsdp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = torchrun(2, str(path), "--out", str(tmp_path / "fsdp"))
    assert "agent sharded with FSDP2" in out
    single = full_ft_config(tiny_model_dir)
    start(TrainConfig.model_validate(single), tmp_path / "single").run(progress=False)

    sharded, plain = metrics(tmp_path / "fsdp"), metrics(tmp_path / "single")
    assert [m["step"] for m in sharded] == [1, 2]
    for a, b in zip(sharded, plain):
        assert a["reward_agent"] == b["reward_agent"]
        for key in ("loss", "grad_norm", "entropy", "kl", "logprob_gap", "trained_tokens"):
            assert a["train_agent"][key] == pytest.approx(b["train_agent"][key], abs=1e-5), key
    assert plain[1]["train_agent"]["kl"] > 1e-6, "the first update moved the weights away from the reference"
    step1 = run_layout.checkpoint_dir(tmp_path / "fsdp", 1)
    shards = sorted(p.name for p in (step1 / "sharded" / "agent").iterdir())
    assert "__0_0.distcp" in shards and "__1_0.distcp" in shards and ".metadata" in shards
    assert not (step1 / "weights").exists(), "a sharded agent's weights are only in its shards"

    shutil.rmtree(run_layout.checkpoint_dir(tmp_path / "fsdp", 2))
    torchrun(1, "--resume", str(tmp_path / "fsdp"))
    resumed = metrics(tmp_path / "fsdp")
    assert resumed[0] == sharded[0]
    for key in ("loss", "grad_norm", "entropy", "kl"):
        assert resumed[1]["train_agent"][key] == pytest.approx(sharded[1]["train_agent"][key], abs=1e-5), key

    # scope eval reads a sharded checkpoint whole in one process: the weights the unsharded run ended with.
    from safetensors.torch import load_file

    from scope_marl.evaluation.evaluate import load_agent

    agent = load_agent(str(tmp_path / "fsdp"))
    whole = load_file(run_layout.weights_path(run_layout.checkpoint_dir(tmp_path / "single", 2), "agent"))
    mine = agent.chat.model.state_dict()
    assert whole.keys() <= mine.keys()
    assert all(torch.allclose(mine[k], whole[k], atol=1e-4) for k in whole)


def test_fsdp_refuses_lora_with_the_fix(tiny_model_dir, tmp_path):
    cfg = TrainConfig.model_validate(config(tiny_model_dir, hardware={"device": "cpu", "parallel": "fsdp"}))
    with pytest.raises(ValueError, match="finetune: full.*use parallel: replicate with finetune: lora"):
        start(cfg, tmp_path / "run")
