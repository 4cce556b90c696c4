"""tau2-bench retail on the embedded model: a few training steps per paper arm, fixed seeds.

Each arm is its shipped config (configs/train_tau2_retail_{frozen,vs,cotrain,population}.yaml) with
fewer steps, periodic evaluation off, and (by default) the four retail train tasks that an agent can
pass without any tool call (10, 25, 50, 57: their gold outcome changes nothing in the database), so
a 135M agent's successes can vary within a group and the variance curriculum has something to
reward. The population arm snapshots its user every step so its pool is used.

Prints per arm what happened, then the figures of the whole run:
    RESULT arms=4 steps=S vs_parse=P tool_parse=Q sim_adv_nonzero=Z seconds=T
vs_parse: share of VS user turns whose candidates parsed (no fallback to the raw text);
tool_parse: share of tool calls (either role) that parsed; sim_adv_nonzero: share of the trainable
user's samples (co-training and population) with a non-zero advantage.

    python bench/tau2_train.py [--steps 2] [--all-tasks] [--out runs/bench-tau2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import torch

from scope_marl.config import TrainConfig, load_config
from scope_marl.core.machine import gemm_gflops
from scope_marl.envs.base import malformed_calls
from scope_marl.experiment import start
from scope_marl.rollout import read_episodes

ARMS = ("frozen", "vs", "cotrain", "population")
ROOT = Path(__file__).resolve().parents[1]
PASSABLE = ["10", "25", "50", "57"]  # retail train tasks whose gold outcome needs no database change


def arm_config(arm: str, steps: int, all_tasks: bool) -> TrainConfig:
    cfg = load_config(ROOT / "configs" / f"train_tau2_retail_{arm}.yaml", TrainConfig)
    update: dict = {"steps": steps, "eval": cfg.eval.model_copy(update={"every": 0}), "checkpoint_every": steps, "threads": 2}
    if not all_tasks:
        update["task_ids"] = PASSABLE
    if cfg.pool is not None:
        update["pool"] = cfg.pool.model_copy(update={"every": 1})
    return cfg.model_copy(update=update)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--all-tasks", action="store_true", help="sample from the whole retail train split")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-tau2"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    gflops = gemm_gflops()
    print(f"machine: fp32 GEMM {gflops:.0f} GFLOP/s")
    shutil.rmtree(args.out, ignore_errors=True)
    started = time.perf_counter()
    vs_turns = vs_parsed = calls = calls_parsed = 0
    user_samples = user_nonzero = 0.0
    for arm in ARMS:
        arm_started = time.perf_counter()
        run_dir = args.out / arm
        records = start(arm_config(arm, args.steps, args.all_tasks), run_dir).run(progress=False)
        episodes = [e for f in sorted((run_dir / "rollouts").glob("*.jsonl")) for e in read_episodes(f)]
        for e in episodes:
            for turn in e.metadata.get("simulator_turns", []):
                if turn.get("mode") == "vs":
                    vs_turns += 1
                    vs_parsed += not turn["fallback"]
            parsed = sum(len(m.tool_calls or []) for m in e.messages)
            calls += parsed + sum(malformed_calls(e.messages).values())
            calls_parsed += parsed
        for r in records:
            user = r.get("train_user")
            if user and user.get("episodes"):
                user_samples += user["episodes"]
                user_nonzero += user["nonzero_advantages"] * user["episodes"]
        agent = [r.get("reward_agent", {}).get("mean") for r in records]
        users = [e.simulator_id for e in episodes]
        stops = sum(e.metadata.get("termination") == "user_stop" for e in episodes)
        print(
            f"{arm}: {len(episodes)} episodes, {stops} ended by the user, agent reward per step {agent}, "
            f"users {sorted(set(users))}, {time.perf_counter() - arm_started:.0f} s"
        )
        for r in records:
            print("  " + json.dumps({k: r[k] for k in ("step", "reward_agent", "reward_user", "rollout_s", "update_s") if k in r}))
    seconds = time.perf_counter() - started
    vs_parse = vs_parsed / vs_turns if vs_turns else float("nan")
    tool_parse = calls_parsed / calls if calls else float("nan")
    sim_adv = user_nonzero / user_samples if user_samples else float("nan")
    print(f"VS user turns {vs_turns}, tool calls {calls} ({calls_parsed} parsed), trainable-user samples {user_samples:.0f}")
    print(
        f"RESULT arms={len(ARMS)} steps={args.steps} vs_parse={vs_parse:.3f} tool_parse={tool_parse:.3f} "
        f"sim_adv_nonzero={sim_adv:.3f} seconds={seconds:.0f}"
    )


if __name__ == "__main__":
    main()
