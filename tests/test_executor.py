"""The executor interface (scope_marl.executor): chosen once from the config by open_executor, and every
local implementation plays the episodes the engine itself would (Ray's: tests/test_ray_executor.py)."""

from __future__ import annotations

import functools

import pytest

from scope_marl.assembly import build_rollout
from scope_marl.config import ExecutorSettings, RolloutRunConfig
from scope_marl.executor import LocalExecutor, RankExecutor, open_executor, split_blocks

CFG = RolloutRunConfig.model_validate(
    {
        "agent": {"model": "scripted:Please say the word.", "trainable": False},
        "simulator": {"mode": "frozen", "model": "scripted:No way."},
        "rollout": {"group_size": 3, "progress": False},
    }
)


def texts(episodes) -> list[tuple]:
    """What identifies each episode (its id carries its group's number) and what was said; the scripted
    players say the same in every call, so engines built apart can be compared."""
    return [(e.episode_id, e.group_id, tuple(m.content for m in e.messages)) for e in episodes]


def test_open_executor_picks_the_implementation_the_config_names():
    factory = functools.partial(build_rollout, CFG)
    local = open_executor(CFG, factory)
    assert type(local) is LocalExecutor and local.engine is not None and local.parallelism == 1
    assert local.describe() == "this process"
    jobs_only = open_executor(ExecutorSettings(), factory=None)
    assert jobs_only.map([lambda: 1, lambda: 2]) == [1, 2] and jobs_only.generated_tokens == 0

    class OneRank:
        rank, world = staticmethod(lambda: 0), staticmethod(lambda: 1)

    assert type(open_executor(CFG, factory, ranks=OneRank())) is LocalExecutor, "a world of one plays here"


def test_the_local_executor_plays_what_the_engine_plays_under_the_numbers_given():
    tasks = build_rollout(CFG).env.tasks("train")[:4]
    expected = build_rollout(CFG).run(tasks, first_group=7)
    executor = LocalExecutor(build_rollout(CFG))
    executor.push(object(), ["agent"], version=1)  # its engine plays on the learner's own model: nothing to send
    assert texts(executor.play(tasks, first_group=7)) == texts(expected)


def test_data_parallel_ranks_each_play_their_block_and_together_the_whole_batch():
    """Two ranks stood in for by two engines; the gather is what every rank receives."""
    tasks = build_rollout(CFG).env.tasks("train")[:5]
    expected = build_rollout(CFG).run(tasks, first_group=3)
    blocks = {}

    class Ranks:
        def __init__(self, rank):
            self._rank = rank

        def rank(self):
            return self._rank

        def world(self):
            return 2

        def gather(self, episodes):
            blocks[self._rank] = episodes
            return [e for r in sorted(blocks) for e in blocks[r]]

    first = RankExecutor(build_rollout(CFG), Ranks(0)).play(tasks, first_group=3)
    assert len(first) == 3 * CFG.rollout.group_size, "rank 0 plays the first block (3 of 5 tasks)"
    both = RankExecutor(build_rollout(CFG), Ranks(1)).play(tasks, first_group=3)
    assert texts(both) == texts(expected)


@pytest.mark.parametrize(("n", "parts"), [(5, 2), (2, 4), (0, 3), (9, 3)])
def test_split_blocks_cover_every_group_once_in_order(n, parts):
    blocks = split_blocks(n, parts)
    assert len(blocks) == parts and [i for a, b in blocks for i in range(a, b)] == list(range(n))
    assert max(b - a for a, b in blocks) - min(b - a for a, b in blocks) <= 1
