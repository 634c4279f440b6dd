"""Running many episodes concurrently against one engine (asyncio).

Each episode is a coroutine (:class:`~srt_agent.rollout.episode.EpisodeRunner`) that alternates
``await engine.agenerate(...)`` and ``await async_step(env, ...)``. At most ``max_concurrent``
episodes are in flight; while some wait on tools, the others' requests keep the engine's batch
full. Results come back in input order whatever order the episodes finish in, and one episode's
failure (env, chat template, engine) only marks that trajectory as failed.

Reproducibility: each request's sampling seed is derived from ``RolloutConfig.seed``, the episode
id and the turn (:func:`~srt_agent.rollout.config.sampling_seed`), so with an engine that honours
per-request seeds the same specs give the same trajectories whatever the concurrency.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from srt_agent.chat_format import ChatFormat
from srt_agent.engine.types import Engine
from srt_agent.rollout.config import EpisodeSpec, RolloutConfig
from srt_agent.rollout.episode import EpisodeRunner
from srt_agent.rollout.trajectory import Trajectory

logger = logging.getLogger("srt_agent.rollout")

ProgressCallback = Callable[[Trajectory], None]
"""Called with each trajectory as its episode finishes (in completion order), on the event loop."""


class RolloutScheduler:
    """Rolls out batches of episodes concurrently with bounded concurrency.

    Args:
        engine: Any :class:`~srt_agent.engine.types.Engine` (its ``agenerate`` is awaited
            concurrently, so it should batch requests that arrive together).
        fmt: The chat format of the engine's model (tokenizer and template).
        config: Limits and sampling options; defaults to ``RolloutConfig()``.
        progress: Called with each finished trajectory (e.g. a :class:`RolloutProgress`).
    """

    def __init__(
        self,
        engine: Engine,
        fmt: ChatFormat,
        config: RolloutConfig | None = None,
        *,
        progress: ProgressCallback | None = None,
    ):
        self.engine = engine
        self.fmt = fmt
        self.config = config or RolloutConfig()
        self.progress = progress

    async def run(self, episodes: Sequence[EpisodeSpec]) -> list[Trajectory]:
        """Roll out every episode; trajectories come back in the order of ``episodes``.

        Args:
            episodes: The episodes; their ``episode_id`` values must be unique (they name the
                engine requests).

        Returns:
            One trajectory per episode. Failed episodes are trajectories with ``status="failed"``.

        Raises:
            ValueError: Duplicate episode ids.
        """
        _check_unique(episodes)
        # One semaphore per run (not per scheduler): it must belong to the running event loop.
        slots = asyncio.Semaphore(self.config.max_concurrent)
        return list(await asyncio.gather(*(self._one(spec, slots) for spec in episodes)))

    async def _one(self, spec: EpisodeSpec, slots: asyncio.Semaphore) -> Trajectory:
        queued = time.perf_counter()
        async with slots:
            runner = EpisodeRunner(spec, self.engine, self.fmt, self.config, time.perf_counter() - queued)
            traj = await runner.run()
        if self.progress is not None:
            try:
                self.progress(traj)
            except Exception:  # a display bug must not lose the rollout
                logger.warning("progress callback raised", exc_info=True)
        return traj


def _check_unique(episodes: Sequence[EpisodeSpec]) -> None:
    seen: set[str] = set()
    for spec in episodes:
        if spec.episode_id in seen:
            raise ValueError(
                f"duplicate episode_id {spec.episode_id!r}; give repeats of a task distinct trial numbers "
                "or episode ids"
            )
        seen.add(spec.episode_id)


def run_rollouts(
    engine: Engine,
    fmt: ChatFormat,
    episodes: Sequence[EpisodeSpec],
    config: RolloutConfig | None = None,
    *,
    progress: ProgressCallback | None = None,
    **overrides: Any,
) -> list[Trajectory]:
    """Synchronous :meth:`RolloutScheduler.run`: starts an event loop and rolls out ``episodes``.

    Call it from synchronous code only; inside a running event loop, await
    ``RolloutScheduler(...).run(...)`` instead.

    Args:
        engine: The engine.
        fmt: The chat format of the engine's model.
        episodes: The episodes to play.
        config: Scheduler options (default ``RolloutConfig()``).
        progress: Called with each finished trajectory.
        **overrides: ``RolloutConfig`` fields to override, e.g. ``max_concurrent=8``.

    Returns:
        One trajectory per episode, in input order.
    """
    cfg = config or RolloutConfig()
    if overrides:
        cfg = RolloutConfig.model_validate({**cfg.model_dump(), **overrides})
    scheduler = RolloutScheduler(engine, fmt, cfg, progress=progress)

    async def main() -> list[Trajectory]:
        # Env make/reset/step run in the loop's default thread pool, which asyncio sizes by CPU
        # count (6 threads on 2 cores); an env blocked on I/O in a worker thread would then hold
        # up the other episodes' steps. We own this loop, so give it one thread per episode slot.
        workers = min(cfg.max_concurrent, 64)
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="srt-env")
        )
        return await scheduler.run(episodes)

    return asyncio.run(main())
