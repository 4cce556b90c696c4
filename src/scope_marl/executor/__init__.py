"""Where rollouts are played: one interface (:class:`Executor`), chosen once from the config by
:func:`open_executor`; see :mod:`scope_marl.executor.base` for the implementations."""

from __future__ import annotations

from pathlib import Path

from scope_marl.executor.base import EngineFactory, Executor, LocalExecutor, split_blocks
from scope_marl.executor.ranks import RankExecutor, Ranks
from scope_marl.rollout.engine import RolloutEngine

__all__ = ["EngineFactory", "Executor", "LocalExecutor", "RankExecutor", "Ranks", "open_executor", "split_blocks"]


def open_executor(
    cfg,
    factory: EngineFactory | None,
    engine: RolloutEngine | None = None,
    ranks: Ranks | None = None,
    sampler_folder: str | Path | None = None,
) -> Executor:
    """The executor a config asks for. ``cfg`` is any config with ``executor`` and ``ray`` settings (and
    optionally ``sampler``); ``factory`` builds an engine (what each Ray worker runs; here when no
    ``engine`` is given, or None for a jobs-only executor); ``ranks``: this process is one of several
    data-parallel ranks; ``sampler_folder``: where adapters for a sampler server are written. A training
    config with ``trainer.mode: async`` gets a generator process that plays ahead of the learner, Ray
    workers that do (``executor: ray``), or a play thread on the sampler server (``sampler``)."""
    trainer = getattr(cfg, "trainer", None)
    asynchronous = trainer is not None and trainer.mode == "async"
    if cfg.executor == "ray":
        from scope_marl.executor.ray_workers import RayExecutor

        r = cfg.ray
        return RayExecutor(factory, workers=r.workers, address=r.address, threads=r.threads, num_cpus=r.num_cpus, asynchronous=asynchronous)
    if getattr(cfg, "sampler", None) is not None:
        from scope_marl.executor.sampler import SamplerExecutor

        return SamplerExecutor(engine if engine is not None else factory(), sampler_folder, asynchronous=asynchronous)
    if asynchronous:
        from scope_marl.executor.generator import GeneratorExecutor

        return GeneratorExecutor(factory, threads=trainer.generator_threads)
    if engine is None and factory is not None:
        engine = factory()
    if ranks is not None and ranks.world() > 1:
        return RankExecutor(engine, ranks)
    return LocalExecutor(engine)
