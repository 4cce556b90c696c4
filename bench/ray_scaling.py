"""Rollouts on Ray workers against the local engine and against two plain processes.

The same P4G rollout (synthetic personas, embedded SmolLM2-135M agent and frozen simulator, torch on 1
thread everywhere) is played: by the local engine; by Ray with 1 and with 2 rollout workers; and by two
plain processes without Ray that play half each (this machine's real limit for two workers). Every
setting plays one warm-up batch first (not timed), then the timed batch. Ends with

    RESULT local_eps=L workers1_eps=W1 workers2_eps=W2 procs2_ratio=P ratio=R overhead=O startup_s=S

- L, W1, W2: episodes per second of the local engine and of Ray with 1 and 2 workers;
- P: the two plain processes' speed-up over the local engine; R = W2 / W1 (target R >= 0.9 P);
- O = L / W1 - 1 (Ray's cost on one worker; target <= 0.10);
- S: seconds from ray.init to the first episodes back: the cluster starts, the worker loads its
  model, and plays a one-task probe (2 episodes) first.

Usage: python bench/ray_scaling.py [--tasks 8]
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import os
import time

import torch

from scope_marl.assembly import build_rollout
from scope_marl.config import RolloutRunConfig
from scope_marl.core.machine import gemm_gflops

SAMPLING = {"temperature": 0.7, "top_p": 0.95, "max_new_tokens": 32}


def config(tasks: int) -> RolloutRunConfig:
    return RolloutRunConfig.model_validate(
        {
            "env": {"name": "p4g", "source": "synthetic", "max_exchanges": 2, "word_limit": 20},
            "num_tasks": 4 * tasks,
            "agent": {"model": "embedded", "sampling": SAMPLING, "trainable": True},
            "simulator": {"mode": "frozen", "model": "embedded", "sampling": SAMPLING},
            "rollout": {"group_size": 2, "max_concurrent": 64, "on_turn_limit": "continue", "on_empty_reply": "keep", "progress": False},
        }
    )


def batches(cfg: RolloutRunConfig, tasks: int):
    """The warm-up tasks and the timed tasks (different tasks, fixed)."""
    from scope_marl.assembly import build_env

    all_tasks = build_env(cfg.env).tasks("train")
    return all_tasks[:tasks], all_tasks[tasks : 2 * tasks]


def local(cfg, warm, timed) -> float:
    torch.set_num_threads(1)
    engine = build_rollout(cfg)
    engine.run(warm, first_group=0)
    started = time.perf_counter()
    episodes = engine.run(timed, first_group=len(warm))
    return len(episodes) / (time.perf_counter() - started)


def on_ray(cfg, warm, timed, workers: int) -> tuple[float, float]:
    """(episodes/s of the timed batch, seconds from ray.init to the warm-up's episodes)."""
    import ray

    from scope_marl.executor.ray_workers import RayExecutor

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    started = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    executor = RayExecutor(functools.partial(build_rollout, cfg), workers=workers, threads=1, num_cpus=1)
    try:
        executor.play(warm[:1], first_group=10_000)  # the probe: the first episodes back
        startup = time.perf_counter() - started
        executor.play(warm, first_group=0)
        started = time.perf_counter()
        episodes = executor.play(timed, first_group=len(warm))
        return len(episodes) / (time.perf_counter() - started), startup
    finally:
        executor.close()
        ray.shutdown()


def _half(cfg, warm, timed, barrier, results, index) -> None:
    torch.set_num_threads(1)
    engine = build_rollout(cfg)
    engine.run(warm, first_group=0)
    barrier.wait()
    started = time.perf_counter()
    engine.run(timed, first_group=len(warm))
    results[index] = time.perf_counter() - started


def two_processes(cfg, warm, timed) -> float:
    """Episodes/s of two plain processes, each playing half of the timed batch, started together."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Array("d", 2)
    half = len(timed) // 2
    parts = [(warm[: len(warm) // 2], timed[:half]), (warm[len(warm) // 2 :], timed[half:])]
    procs = [ctx.Process(target=_half, args=(cfg, w, t, barrier, results, i)) for i, (w, t) in enumerate(parts)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return len(timed) * cfg.rollout.group_size / max(results[:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=8, help="tasks per batch (2 episodes each)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    gflops = gemm_gflops()
    cfg = config(args.tasks)
    warm, timed = batches(cfg, args.tasks)
    episodes = len(timed) * cfg.rollout.group_size
    print(
        f"GEMM {gflops:.1f} GFLOP/s (1 thread); {episodes} episodes per batch, P4G, 2 exchanges, {SAMPLING['max_new_tokens']}-token turns"
    )
    rows = []
    L = local(cfg, warm, timed)
    rows.append(("local engine, 1 thread", L))
    W1, startup = on_ray(cfg, warm, timed, workers=1)
    rows.append(("Ray, 1 worker", W1))
    W2, _ = on_ray(cfg, warm, timed, workers=2)
    rows.append(("Ray, 2 workers", W2))
    P2 = two_processes(cfg, warm, timed)
    rows.append(("2 plain processes", P2))
    print(f"{'setting':<26} {'episodes/s':>10}")
    for name, eps in rows:
        print(f"{name:<26} {eps:>10.3f}")
    P, R, over = P2 / L, W2 / W1, L / W1 - 1
    print(
        f"procs2 speed-up {P:.2f}, Ray 2/1 workers {R:.2f} (target >= {0.9 * P:.2f}), Ray overhead on 1 worker {over:.3f} (target <= 0.10)"
    )
    print(
        f"RESULT local_eps={L:.3f} workers1_eps={W1:.3f} workers2_eps={W2:.3f} procs2_ratio={P:.3f} ratio={R:.3f} overhead={over:.3f} startup_s={startup:.1f}"
    )


if __name__ == "__main__":
    main()
