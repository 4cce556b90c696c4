"""Pinned rollouts: P4G and lab results written before the tool-call protocol existed must come out
the same after it (and after any later change that is not meant to change them).

The golden file was written by this module (``SCOPE_WRITE_GOLDEN=1 pytest tests/test_unchanged_episodes.py``)
on the code before the protocol change. Texts, token ids, masks, rewards and statuses must match
byte for byte; log-probs and entropies are compared at 4 decimals (within one unit there) and
timings are left out, because the last bits of a float differ between CPUs (SIMD widths) and
batch shapes, not between versions of this code.

Those last bits can still flip a near-tie draw, and GEMM kernels differ between CPU makers, so
each kind of CPU (maker and widest vector unit) has its own file, ``golden_episodes.KIND.jsonl``;
on a kind without one the test skips and says how to record it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from scope_marl.backends.packed_linear import PackedWeights, packing_available
from scope_marl.backends.seat import Seat
from scope_marl.config import RolloutConfig
from scope_marl.core.types import SamplingParams
from scope_marl.envs import SayTheWord
from scope_marl.envs.p4g import PersuasionForGood
from scope_marl.lab import arms, loop
from scope_marl.lab.games import load_game
from scope_marl.lab.panel import build_panel, load_panel
from scope_marl.rollout import RolloutEngine
from scope_marl.simulators import FrozenSimulator, VerbalizedSampling


def cpu_kind() -> str:
    """This CPU's maker and widest vector unit, e.g. ``GenuineIntel-avx512`` (what decides the float sums)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    field = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in info.splitlines()[:40])}
    flags = field.get("flags", "").split()
    vector = next((name for name in ("avx512f", "avx2") if name in flags), "other").removesuffix("f")
    return f"{field.get('vendor_id', 'unknown')}-{vector}"


GOLDEN = Path(__file__).parent / "data" / f"golden_episodes.{cpu_kind()}.jsonl"
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=24)


def rounded(value):
    """Floats at 4 decimals (cross-CPU last bits), everything else as is; timings dropped."""
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, list):
        return [rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items() if k != "timings"}
    return value


def episode_lines(talky_chat) -> list[str]:
    """Seeded rollouts on the token-level path (trainable agent and user) and the respond path (VS)."""
    lines = []
    p4g = PersuasionForGood(source="synthetic", synthetic_tasks=40, max_exchanges=2, word_limit=20)
    setups = [
        (p4g, FrozenSimulator(talky_chat, SAMPLING, simulator_id="frozen-tiny"), True),
        (SayTheWord(num_tasks=2, max_exchanges=2), VerbalizedSampling(talky_chat, k=3, sampling=SAMPLING), False),
    ]
    for env, simulator, trainable_user in setups:
        if trainable_user:
            simulator.seat.trainable = True
        agent = Seat(model=talky_chat, sampling=SAMPLING, trainable=True)
        config = RolloutConfig(progress=False, group_size=2, seed=11, on_empty_reply="keep")
        engine = RolloutEngine(env, agent, simulator, config)
        for episode in engine.run(env.tasks("train")[:2]):
            lines.append(json.dumps(rounded(json.loads(episode.model_dump_json()))))
    return lines


def lab_line() -> str:
    game = load_game("theory")
    settings = arms.with_settings("theory", steps=4, eval_every=2, eval_groups=4, eval_group_size=4, groups=4, group_size=4)
    run = loop.train_arm(game, "cotrain", seed=0, s=settings, panel=build_panel(game, load_panel("heldout")))
    return json.dumps(rounded({"lab": run}))


def test_p4g_and_lab_episodes_are_unchanged(talky_chat, rows_attention_op):
    # rows_attention_op: recorded with the compiled decode attention, whose sums run in another
    # order than SDPA's (without it a near-tie draw flips), so the test needs it built.
    # The file was recorded on oneDNN-packed weights, whose fp32 GEMM rounds unlike torch's; the
    # sampler packs only where calibration measures it faster (backends.packed_linear), so pin it.
    talky_chat.packed = PackedWeights(always=True) if packing_available() else None
    # Recorded with torch's sampling ops; the compiled sampler draws the same ids (test_hf_backend
    # checks it on 49,152-token rows) but sums in another order, which may flip a near tie.
    talky_chat.compiled_sampling = False
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the float sums of one thread, whatever ran before in this process
    try:
        lines = [*episode_lines(talky_chat), lab_line()]
    finally:
        torch.set_num_threads(threads)
    if os.environ.get("SCOPE_WRITE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text("\n".join(lines) + "\n")
        pytest.skip(f"wrote {GOLDEN}")
    if not GOLDEN.exists():
        pytest.skip(f"no episodes recorded on this kind of CPU ({cpu_kind()}); record them: SCOPE_WRITE_GOLDEN=1 pytest {__file__}")
    golden = GOLDEN.read_text().splitlines()
    assert len(lines) == len(golden)
    for new, old in zip(lines, golden):
        assert same(json.loads(new), json.loads(old)), f"changed: {json.loads(old).get('episode_id', 'lab run')}"


def same(new, old) -> bool:
    """Equal, floats within one unit of their 4th decimal (a value near a rounding boundary may
    round either way when its last bits move with the batch's shape); everything else exactly."""
    if isinstance(old, float) and isinstance(new, (int, float)):
        return abs(new - old) <= 1.5e-4
    if isinstance(old, list):
        return isinstance(new, list) and len(new) == len(old) and all(same(a, b) for a, b in zip(new, old))
    if isinstance(old, dict):
        return isinstance(new, dict) and new.keys() == old.keys() and all(same(new[k], old[k]) for k in old)
    return new == old
