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
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from srt_agent.chat.messages import Message
from srt_agent.chat.template import ChatFormat, TokenTranscript
from srt_agent.contracts.generation import Engine, GenerationRequest
from srt_agent.contracts.speculation import spec_delta
from srt_agent.contracts.trajectory import Trajectory
from srt_agent.env.registration import Isolation, make, resolve_isolation
from srt_agent.rollout.config import EpisodeRequest, RolloutConfig, RunAheadConfig
from srt_agent.rollout.episode import EnvFactory, EpisodeHooks, EpisodeRunner, tool_grammar
from srt_agent.rollout.heap import release_free_heap
from srt_agent.rollout.metrics import RolloutMetrics, RunAheadStats, Timeline, batch_metrics
from srt_agent.rollout.runahead import RunAhead

if TYPE_CHECKING:
    from srt_agent.rollout.env_processes import EnvProcessPool
    from srt_agent.tooling.grammar import ToolCallGrammar

T = TypeVar("T")

logger = logging.getLogger("srt_agent.rollout")

ProgressCallback = Callable[[Trajectory], None]
"""Called with each trajectory as its episode finishes (in completion order), on the event loop."""


@dataclass(frozen=True)
class RolloutBatch:
    """A rolled-out batch: the trajectories (in input order) and what the batch measured.

    Attributes:
        trajectories: One per episode, in the order of the episodes given.
        metrics: Speculation, run-ahead and time-split figures of the batch.
    """

    trajectories: tuple[Trajectory, ...]
    metrics: RolloutMetrics


class RolloutScheduler:
    """Rolls out batches of episodes concurrently with bounded concurrency.

    With a :class:`~srt_agent.engine.torch_engine.TorchEngine` that has a draft source (the tree
    cache), every live turn is drafted from the cache and feeds it; the engine does that on its
    own. ``runahead`` adds run-ahead work while episodes wait (:mod:`srt_agent.rollout.runahead`);
    it only makes sense with such an engine.

    Args:
        engine: Any :class:`~srt_agent.contracts.generation.Engine` (its ``agenerate`` is awaited
            concurrently, so it should batch requests that arrive together).
        fmt: The chat format of the engine's model (tokenizer and template).
        config: Limits and sampling options; defaults to ``RolloutConfig()``.
        progress: Called with each finished trajectory (e.g. a :class:`RolloutProgress`).
        runahead: Run-ahead options; ``None`` (the default), or off for this engine
            (:meth:`RunAheadConfig.runs_on`): no run-ahead.
        env_factory: Makes each episode's env (default: in this process).
    """

    def __init__(
        self,
        engine: Engine,
        fmt: ChatFormat,
        config: RolloutConfig | None = None,
        *,
        progress: ProgressCallback | None = None,
        runahead: RunAheadConfig | None = None,
        env_factory: EnvFactory | None = None,
    ):
        self.engine = engine
        self.env_factory = env_factory
        self.fmt = fmt
        self.config = config or RolloutConfig()
        self.progress = progress
        self.runahead = (
            RunAhead(engine, fmt, self.config, runahead)
            if runahead is not None and runahead.runs_on(engine)
            else None
        )
        self.last_metrics: RolloutMetrics | None = None
        self._pool: EnvProcessPool | None = None  # env worker processes, started on first use
        self._isolation: dict[str, Isolation] = {}  # env id -> its registered isolation

    def announce(self, episodes: Sequence[EpisodeRequest]) -> int:
        """Tell the scheduler which episodes come next, so their first turns can be generated ahead.

        Each episode's env is made and reset here (blocking, in the caller's thread) and its first
        prompt rendered exactly as the live episode will render it, so the run-ahead content is
        filed under the state key the live request will carry. The jobs run during the next
        rollout batch, in rows its live requests leave free, and expire at its end: announce batch
        ``k + 1`` before rolling out batch ``k``. Without run-ahead this does nothing.

        Args:
            episodes: The coming episodes (typically the trainer's next batch).

        Returns:
            Run-ahead jobs queued (``announce_samples`` per distinct first prompt).

        Raises:
            UnknownEnvError: An env id is not registered.
            EnvConfigError: Bad env options.
        """
        if self.runahead is None:
            return 0
        prompts: list[tuple[tuple[int, ...], str, str, ToolCallGrammar | None]] = []
        for spec in episodes:
            env = make(spec.env_id, **dict(spec.env_options))
            try:
                options = None if spec.reset_options is None else dict(spec.reset_options)
                opening, info = env.reset(seed=spec.seed, options=options)
            finally:
                env.close()
            tools = list(info.get("tools") or ())
            start = self.fmt.start(tuple(opening), tools)
            grammar = tool_grammar(tools, self.config)
            prompts.append((start.token_ids, str(info.get("task_id", "")), spec.env_id, grammar))
        return self.runahead.queue_announced(prompts)

    async def run(self, episodes: Sequence[EpisodeRequest]) -> list[Trajectory]:
        """Roll out every episode; trajectories come back in the order of ``episodes``.

        The batch's metrics are kept in :attr:`last_metrics` (:meth:`rollout` returns both).

        Args:
            episodes: The episodes; their ``episode_id`` values must be unique (they name the
                engine requests).

        Returns:
            One trajectory per episode. Failed episodes are trajectories with ``status="failed"``.

        Raises:
            ValueError: Duplicate episode ids.
        """
        return list((await self.rollout(episodes)).trajectories)

    async def rollout(self, episodes: Sequence[EpisodeRequest]) -> RolloutBatch:
        """Like :meth:`run`, and also return the batch's :class:`RolloutMetrics`.

        Raises:
            ValueError: Duplicate episode ids.
        """
        _check_unique(episodes)
        # One semaphore per run (not per scheduler): it must belong to the running event loop.
        slots = asyncio.Semaphore(self.config.max_concurrent)
        hooks = _BatchHooks(self.runahead)
        spec_before = self.engine.spec_stats()
        ahead_before = self.runahead.stats() if self.runahead is not None else RunAheadStats()
        t0 = time.perf_counter()
        if self.runahead is not None:
            self.runahead.start_batch()
        try:
            trajectories = list(await asyncio.gather(*(self._one(spec, slots, hooks) for spec in episodes)))
        finally:
            if self.runahead is not None:
                await self.runahead.end_batch()
        wall_s = time.perf_counter() - t0
        release_free_heap()  # what the batch's threads freed goes back to the OS (see rollout.heap)
        spec = spec_delta(self.engine.spec_stats(), spec_before)
        ahead = self.runahead.stats().minus(ahead_before) if self.runahead is not None else RunAheadStats()
        metrics = batch_metrics(trajectories, spec=spec, runahead=ahead, wall_s=wall_s, split=hooks.split())
        self.last_metrics = metrics
        return RolloutBatch(tuple(trajectories), metrics)

    async def _one(self, spec: EpisodeRequest, slots: asyncio.Semaphore, hooks: EpisodeHooks) -> Trajectory:
        queued = time.perf_counter()
        async with slots:
            runner = EpisodeRunner(
                spec,
                self.engine,
                self.fmt,
                self.config,
                time.perf_counter() - queued,
                hooks=hooks,
                env_factory=self._factory(spec.env_id),
            )
            traj = await runner.run()
        if self.progress is not None:
            try:
                self.progress(traj)
            except Exception:  # a display bug must not lose the rollout
                logger.warning("progress callback raised", exc_info=True)
        return traj

    def _factory(self, env_id: str) -> EnvFactory | None:
        """What makes ``env_id``'s envs: the given factory, else a worker process or this process.

        ``rollout.env_isolation`` decides, or when it is unset the env's registration
        (:func:`~srt_agent.env.registration.register_env`'s ``isolation``).
        """
        if self.env_factory is not None:
            return self.env_factory
        if resolve_isolation(env_id, self.config.env_isolation, self._isolation) == "thread":
            return None
        if self._pool is None:
            from srt_agent.rollout.env_processes import EnvProcessPool

            self._pool = EnvProcessPool(
                self.config.max_concurrent,
                step_timeout_s=self.config.env_step_timeout_s,
                setup_timeout_s=self.config.env_setup_timeout_s,
                max_observation_chars=self.config.max_observation_chars,
            )
        return self._pool

    @property
    def env_processes(self) -> EnvProcessPool | None:
        """The env worker processes (``None`` until an episode's env runs in one)."""
        return self._pool

    def close(self) -> None:
        """Stop the env worker processes, if any (a later episode starts new ones)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None


class _BatchHooks(EpisodeHooks):
    """The scheduler's side of the episode hooks: the time split and the run-ahead queue."""

    def __init__(self, runahead: RunAhead | None) -> None:
        self.timeline = Timeline()
        self.runahead = runahead

    def split(self) -> dict[str, float]:
        return dict(self.timeline.split())

    def generation_started(self, runner: EpisodeRunner, request: GenerationRequest) -> None:
        self.timeline.enter("live")
        if self.runahead is not None:
            self.runahead.live_started(runner.request.episode_id, request.state_key)

    def generation_finished(self, runner: EpisodeRunner, request: GenerationRequest) -> None:
        self.timeline.leave("live")
        if self.runahead is not None:
            self.runahead.live_finished(runner.request.episode_id, request.state_key)

    def episode_started(self, runner: EpisodeRunner) -> None:
        if self.runahead is not None:
            self.runahead.episode_started()

    def step_started(self, runner: EpisodeRunner, transcript: TokenTranscript, action: str) -> None:
        self.timeline.enter("env")
        if self.runahead is not None:
            try:
                self.runahead.predict_after_tools(
                    runner.request.episode_id,
                    runner.request.env_id,
                    runner.task_id,
                    transcript,
                    action,
                    len(runner.outputs),
                    runner.grammar,
                )
            except Exception:  # run-ahead is best effort: never fail the episode
                logger.warning("run-ahead prediction failed", exc_info=True)
            self.runahead.env_wait(True)

    def step_finished(self, runner: EpisodeRunner, action: str, observation: tuple[Message, ...]) -> None:
        self.timeline.leave("env")
        if self.runahead is not None:
            self.runahead.env_wait(False)
            if observation:
                self.runahead.record_tools(
                    runner.request.env_id, runner.task_id, action, len(runner.outputs), observation
                )

    def episode_finished(self, runner: EpisodeRunner) -> None:
        if self.runahead is not None:
            self.runahead.episode_ended(runner.request.episode_id)


def _check_unique(episodes: Sequence[EpisodeRequest]) -> None:
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
    episodes: Sequence[EpisodeRequest],
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
    return list(rollout_sync(scheduler, episodes).trajectories)


def rollout_sync(scheduler: RolloutScheduler, episodes: Sequence[EpisodeRequest]) -> RolloutBatch:
    """Synchronous :meth:`RolloutScheduler.rollout` on a fresh event loop (from synchronous code only).

    The same scheduler can be used for many batches (its run-ahead queue and tool memo persist).

    Returns:
        The trajectories, in input order, and the batch's metrics.
    """
    return run_with_env_threads(scheduler.rollout(episodes), scheduler.config.max_concurrent)


def run_with_env_threads(work: Coroutine[Any, Any, T], max_concurrent: int) -> T:
    """Run a rollout coroutine on a fresh event loop with one env thread per episode slot.

    Env make/reset/step run in the loop's default thread pool, which asyncio sizes by CPU count
    (6 threads on 2 cores); an env blocked on I/O in a worker thread would then hold up the other
    episodes' steps. The loop is ours, so it gets one thread per episode slot (at most 64).
    """

    async def main() -> T:
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=min(max_concurrent, 64), thread_name_prefix="srt-env")
        )
        return await work

    return asyncio.run(main())
