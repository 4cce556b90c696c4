"""Asynchronous training (trainer.mode: async) against the synchronous loop, and what the correction buys.

**Part 1: the speed-up.** Generation and learning run on separate resources, as on a cluster where the
sampler has its own GPUs. Here one process generates (the generator, 1 thread) and another learns (the
trainer, 1 thread), and both runs use the same two processes. The sync run alternates them: async
with max_staleness 0, which is the synchronous loop, number for number. The async run overlaps them
(max_staleness 1, tis). Both train the P4G co-training config on the embedded model for the same
steps. The script reports wall time, episodes per hour, the generator's idle fraction, and the final
training reward of each: the agent's mean reward over the last half of the steps, with a bootstrap
interval over tasks.

    RESULT sync_eps_h=... async_eps_h=... speedup=... gen_idle_sync=... gen_idle_async=... staleness_mean=...
    reward_gap=... reward_gap_lo=... reward_gap_hi=... gemm_gflops=...

(gap = async minus sync, with its interval from a bootstrap over both runs' tasks.)

**Part 2: the correction.** A 10-armed Bernoulli bandit whose answer is known (the best arm pays
0.9). It is trained with the project's own loss (training.losses.policy_loss and behaviour_weights) on
batches sampled by the policy of 4 updates earlier (k = 4). One run has no correction (the ratio
against the stale behaviour log-probs); the other uses tis (the ratio against the learner's own
policy, times the truncated behaviour weight). Each gets 20 seeds and 40 updates, at SGD step sizes
0.5 and 2.0; the RESULT line is for 2.0, and the script reports the final expected reward of each.

    RESULT uncorrected=... corrected=... uncorrected_lo=... corrected_lo=...

    python bench/async_train.py [--steps 12] [--part both|speed|bandit] [--out runs/bench-async]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import deque
from pathlib import Path

import numpy as np
import torch

from scope_marl.config import TrainConfig
from scope_marl.config.loading import load_config
from scope_marl.core.machine import gemm_gflops
from scope_marl.evaluation.stats import mean_with_ci, t_interval
from scope_marl.training.losses import behaviour_weights, policy_loss

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "train_p4g_cotrain.yaml"


# ---- part 1: sync vs async on the P4G co-training config ----------------------------------------------------
def train_run(mode_k: int, correction: str, steps: int, out: Path) -> dict:
    from scope_marl.experiment import start

    cfg = load_config(CONFIG, TrainConfig)
    learner = cfg.learner.model_copy(update={"correction": correction})
    cfg = cfg.model_copy(
        update={
            "steps": steps,
            "threads": 1,
            "eval": cfg.eval.model_copy(update={"every": 0}),
            "checkpoint_every": steps,
            "learner": learner,
            "simulator_learner": learner,
            "trainer": cfg.trainer.model_copy(update={"mode": "async", "max_staleness": mode_k, "generator_threads": 1}),
        }
    )
    cfg = TrainConfig.model_validate(cfg.model_dump())
    started = time.perf_counter()
    records = start(cfg, out).run(progress=False)
    wall = time.perf_counter() - started
    episodes = [json.loads(line) for p in sorted((out / "rollouts").glob("*.jsonl")) for line in p.read_text().splitlines()]
    late = [e for e in episodes if e["metadata"]["versions"]["agent"] >= steps // 2 - mode_k]
    generate = sum(r["async"]["generate_s"] for r in records)
    return {
        "wall_s": wall,
        "episodes": len(episodes),
        "eps_h": len(episodes) / wall * 3600,
        "gen_idle": max(0.0, 1.0 - generate / wall),
        "learner_wait": sum(r["rollout_s"] for r in records) / wall,
        "staleness_mean": sum(r["train_agent"]["staleness_mean"] for r in records) / len(records),
        "final_rewards": [e["rewards"]["agent"] for e in late],
        "final_tasks": [e["task_id"] for e in late],
        "lengths": [episode_tokens(e) for e in episodes],  # every episode played is trained: the trained lengths
    }


def episode_tokens(episode: dict) -> int:
    """Tokens sampled in an episode, both roles: its length as the generator pays for it."""
    return sum(sum(s["loss_mask"]) for s in episode["streams"].values())


def length_quantiles(lengths: list[int]) -> str:
    q = np.quantile(lengths, [0.1, 0.5, 0.9])
    return f"p10 {q[0]:.0f}  p50 {q[1]:.0f}  p90 {q[2]:.0f}  max {max(lengths)}  mean {np.mean(lengths):.1f}"


def mean_gap(a: list[float], a_tasks: list[str], b: list[float], b_tasks: list[str], resamples: int = 2000) -> tuple[float, float, float]:
    """mean(a) - mean(b) and its 95% percentile-bootstrap interval, each run's tasks resampled independently
    (a task's episodes are correlated: they share its persona)."""
    rng = np.random.default_rng(0)

    def resampled_means(values, tasks):
        keys = list(dict.fromkeys(tasks))
        sums = np.array([sum(v for v, t in zip(values, tasks) if t == k) for k in keys])
        counts = np.array([sum(1 for t in tasks if t == k) for k in keys], dtype=float)
        picks = rng.integers(0, len(keys), size=(resamples, len(keys)))
        return sums[picks].sum(1) / counts[picks].sum(1)

    diffs = resampled_means(a, a_tasks) - resampled_means(b, b_tasks)
    low, high = np.quantile(diffs, [0.025, 0.975])
    return float(np.mean(a) - np.mean(b)), float(low), float(high)


def ks_statistic(a: list[int], b: list[int]) -> float:
    """The largest gap between the two samples' empirical distribution functions."""
    grid = np.union1d(a, b)
    cdf = lambda x: np.searchsorted(np.sort(x), grid, side="right") / len(x)
    return float(np.max(np.abs(cdf(a) - cdf(b))))


def speed(steps: int, out: Path) -> str:
    sync = train_run(0, "none", steps, out / "sync")
    asyn = train_run(1, "tis", steps, out / "async")
    for name, r in (("sync (k=0)", sync), ("async (k=1, tis)", asyn)):
        reward = mean_with_ci(r["final_rewards"], groups=r["final_tasks"])
        print(
            f"{name:18s} wall {r['wall_s']:7.1f}s  {r['eps_h']:7.1f} episodes/h  generator idle {r['gen_idle']:.2f}  "
            f"learner waiting {r['learner_wait']:.2f}  staleness {r['staleness_mean']:.2f}  "
            f"final reward {reward['mean']:.3f} [{reward['low']:.3f}, {reward['high']:.3f}]"
        )
    for name, r in (("sync", sync), ("async", asyn)):
        print(
            f"trained episode length (tokens sampled, both roles), {name:5s}: {length_quantiles(r['lengths'])}  ({len(r['lengths'])} episodes)"
        )
    ks = ks_statistic(sync["lengths"], asyn["lengths"])
    print(f"  two-sample Kolmogorov-Smirnov distance between them: {ks:.3f}")
    gap, gap_lo, gap_hi = mean_gap(asyn["final_rewards"], asyn["final_tasks"], sync["final_rewards"], sync["final_tasks"])
    return (
        f"RESULT sync_eps_h={sync['eps_h']:.1f} async_eps_h={asyn['eps_h']:.1f} speedup={asyn['eps_h'] / sync['eps_h']:.3f} "
        f"gen_idle_sync={sync['gen_idle']:.3f} gen_idle_async={asyn['gen_idle']:.3f} staleness_mean={asyn['staleness_mean']:.3f} "
        f"reward_gap={gap:.4f} reward_gap_lo={gap_lo:.4f} reward_gap_hi={gap_hi:.4f} "
        f"length_p50_sync={np.median(sync['lengths']):.0f} length_p50_async={np.median(asyn['lengths']):.0f} length_ks={ks:.3f} "
        f"gemm_gflops={gemm_gflops():.1f}"
    )


# ---- part 2: a bandit with stale batches ---------------------------------------------------------------------
ARMS = torch.linspace(0.1, 0.9, 10)  # Bernoulli pay-offs: the best arm's is 0.9


def bandit(correction: str, seed: int, k: int = 4, steps: int = 40, batch: int = 64, lr: float = 2.0) -> float:
    """The expected reward of the final policy, trained on batches sampled ``k`` updates late."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.zeros(len(ARMS), requires_grad=True)
    optimizer = torch.optim.SGD([logits], lr=lr)
    history = deque([logits.detach().clone()], maxlen=k + 1)  # the policies of the last k updates
    for _ in range(steps):
        behaviour = history[0]  # the oldest: k versions behind the learner
        acts = torch.multinomial(behaviour.softmax(-1), batch, replacement=True, generator=g)
        rewards = torch.bernoulli(ARMS[acts], generator=g)
        advantages = rewards - rewards.mean()
        behav_logp = behaviour.log_softmax(-1)[acts][:, None]
        new_logp = logits.log_softmax(-1)[acts][:, None]
        mask = torch.ones_like(new_logp)
        prox_logp = new_logp.detach()
        weights, _ = behaviour_weights(prox_logp, behav_logp, mask, correction, cap=2.0)
        old = behav_logp if correction == "none" else prox_logp
        loss, _ = policy_loss(new_logp, old, advantages, mask, weights=weights)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(logits.detach().clone())
    return float((logits.detach().softmax(-1) * ARMS).sum())


def bandit_part(seeds: int = 20, steps: int = 40) -> str:
    """Both step sizes are printed; the RESULT is the larger one's. At lr 0.5 the policy moves too little in
    4 updates for staleness to matter (the two runs are equal); at lr 2.0 it moves enough that the stale
    ratios leave the clip range, and an uncorrected update then stalls on the clipped tokens."""
    line = ""
    for lr in (0.5, 2.0):
        results = {c: [bandit(c, s, steps=steps, lr=lr) for s in range(seeds)] for c in ("none", "tis")}
        for name, values in results.items():
            stats = t_interval(values)
            print(
                f"bandit k=4 lr {lr} {name:5s}: expected reward after {steps} updates {stats['mean']:.3f} [{stats['low']:.3f}, {stats['high']:.3f}] (best arm 0.9)"
            )
        u, c = t_interval(results["none"]), t_interval(results["tis"])
        line = f"RESULT uncorrected={u['mean']:.4f} corrected={c['mean']:.4f} uncorrected_lo={u['low']:.4f} corrected_lo={c['low']:.4f}"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--part", choices=("both", "speed", "bandit"), default="both")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-async"))
    args = parser.parse_args()
    lines = []
    if args.part in ("both", "bandit"):
        lines.append(bandit_part())
    if args.part in ("both", "speed"):
        if args.out.exists():
            raise SystemExit(f"{args.out} exists: the two runs need fresh directories; remove it or pass --out NEW")
        lines.append(speed(args.steps, args.out))
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
