"""The same P4G episodes on our rollout engine and on a vLLM server, and how far vLLM's log-probs are from ours.

Both play the same tasks with the same seeds: the agent and a frozen simulator, both the embedded
SmolLM2-135M-Instruct, temperature 0.7, top-p 1 (where vLLM's processed log-probs are defined as ours).
First the engine on the local model (before any server runs, so nothing competes for the cores), then
a vLLM server from ``scope serve vllm``'s venv (started here unless --url names a running one; its
start-up is not timed) plays the episodes through the vllm backend. Every vLLM-sampled agent token is
then re-scored by the learner's own computation on the local model: ``logprob_gap`` is the largest
absolute difference.

    python bench/vllm_vs_engine.py [--tasks 16 --group 4] [--venv DIR | --url URL]

Ends with: RESULT engine_eps=E vllm_eps=V ratio=R logprob_gap=G
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from scope_marl.backends import load_backend
from scope_marl.backends.base import BackendError
from scope_marl.backends.seat import Seat
from scope_marl.backends.vllm_server import default_venv, running_server
from scope_marl.config import LearnerConfig, RolloutConfig
from scope_marl.core.machine import gemm_gflops
from scope_marl.core.types import SamplingParams
from scope_marl.envs import AGENT
from scope_marl.envs.p4g import PersuasionForGood
from scope_marl.rollout import RolloutEngine
from scope_marl.simulators import FrozenSimulator
from scope_marl.training.learner import Learner

SAMPLING = SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=48)


def play(model, tasks, group: int, seed: int) -> tuple[list, float, int]:
    env = PersuasionForGood(max_exchanges=3, word_limit=30)
    engine = RolloutEngine(
        env,
        Seat(model=model, sampling=SAMPLING, trainable=True),
        FrozenSimulator(model, SAMPLING),
        RolloutConfig(group_size=group, max_concurrent=len(tasks) * group, seed=seed, on_turn_limit="continue", progress=False),
    )
    clock = time.perf_counter()
    episodes = engine.run(tasks)
    seconds = time.perf_counter() - clock
    tokens = sum(len(s.response_ids) for e in episodes for s in e.streams.values())
    return episodes, seconds, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--venv", default=os.environ.get("SCOPE_VLLM_VENV") or str(default_venv("cpu")))
    parser.add_argument("--url", default=None, help="a running server serving the embedded model as 'embedded'")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    gflops = gemm_gflops()
    print(f"machine: fp32 GEMM {gflops:.1f} GFLOP/s, {os.cpu_count()} cores")
    local = load_backend("embedded")
    tasks = PersuasionForGood(max_exchanges=3, word_limit=30).tasks("test")[: args.tasks]
    episodes, engine_s, engine_tokens = play(local, tasks, args.group, seed=0)

    with running_server(args.url, Path(args.venv)) as url:
        remote = load_backend(f"vllm:embedded@{url}")
        remote.generate_ids([[1, 2, 3]], SAMPLING.model_copy(update={"max_new_tokens": 4}))  # warm-up, untimed
        remote_episodes, vllm_s, vllm_tokens = play(remote, tasks, args.group, seed=0)

    learner = Learner(local, AGENT, None, SAMPLING.temperature, LearnerConfig(kl_coef=0.0))
    streams = [e.streams[AGENT] for e in remote_episodes if e.streams.get(AGENT) and e.streams[AGENT].logprobs]
    gap = 0.0
    with torch.no_grad():
        for start in range(0, len(streams), 8):
            chunk = streams[start : start + 8]
            logp, _, mask = learner.score(chunk)
            for j, s in enumerate(chunk):
                n = len(s.logprobs)
                diff = (logp[j, :n] - torch.tensor(s.logprobs)).abs() * mask[j, :n]
                gap = max(gap, float(diff.max()))
    n = len(episodes)
    engine_eps, vllm_eps = n / engine_s, len(remote_episodes) / vllm_s
    print(f"{'':<10}{'episodes':>10}{'seconds':>10}{'tokens':>10}{'tok/s':>10}{'eps/s':>10}")
    print(f"{'engine':<10}{n:>10}{engine_s:>10.1f}{engine_tokens:>10}{engine_tokens / engine_s:>10.1f}{engine_eps:>10.3f}")
    print(f"{'vllm':<10}{len(remote_episodes):>10}{vllm_s:>10.1f}{vllm_tokens:>10}{vllm_tokens / vllm_s:>10.1f}{vllm_eps:>10.3f}")
    print(f"agent tokens re-scored by the learner: {sum(len(s.logprobs) for s in streams)}")
    print(f"RESULT engine_eps={engine_eps:.3f} vllm_eps={vllm_eps:.3f} ratio={vllm_eps / engine_eps:.3f} logprob_gap={gap:.6f}")


if __name__ == "__main__":
    try:
        main()
    except BackendError as error:  # the server would not start or answer: say why, no traceback
        raise SystemExit(f"error: {error}") from None
