"""The trainer's rollout side: the SRT engine with its tree cache, a plain baseline engine, evaluation.

One :class:`~srt_agent.engine.torch_engine.TorchEngine` with the run's
:class:`~srt_agent.tree_cache.TreeCache` as draft source serves every training and evaluation rollout; the
cache persists across steps (and checkpoints), so later steps draft from all earlier ones. A second
engine without a draft source is built on the first baseline step (``trainer.baseline_every``) to
time the same prompts with speculation off; it gets the policy's weights just before each use.

The rollout scheduler is kept for the whole run, so that a scheduler with a run-ahead queue can be
told the next step's prompts (:meth:`Rollouts.rollout`'s ``announce``) while this step's episodes
wait on tools.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from srt_agent.chat.template import ChatFormat
from srt_agent.config import RunConfig
from srt_agent.contracts.speculation import SpecStats
from srt_agent.contracts.trajectory import Trajectory
from srt_agent.distributed.ray_engine import RayEngine
from srt_agent.evaluation import EvalReport, run_eval
from srt_agent.rollout.config import EpisodeRequest
from srt_agent.rollout.scheduler import ProgressCallback, RolloutScheduler, run_with_env_threads
from srt_agent.runtime import Runtime, build_runtime
from srt_agent.train.checkpoint import CACHE_FILE
from srt_agent.tree_cache import TreeCache

log = logging.getLogger("srt_agent.train")


@dataclass(frozen=True)
class StepRollout:
    """One rollout call's result.

    Attributes:
        trajectories: One per episode, in the order of the specs.
        seconds: Wall seconds of the call.
        spec: The engine's speculation counters over the call (run-ahead rows included).
        extra: The scheduler's own batch figures where it reports them (run-ahead work, draft
            hit rates by source, the wall-time split), prefixed ``sched_``.
    """

    trajectories: list[Trajectory]
    seconds: float
    spec: SpecStats
    extra: dict[str, float] = field(default_factory=dict)


class Rollouts:
    """Engines, tree cache and scheduler of a training run.

    Args:
        cfg: The run config.
        model_dir: The starting checkpoint (the engines load it; the trainer then pushes its weights).
        fmt: The model's chat format.
        cache: The tree cache (new, or loaded from a checkpoint).
        device: Where the engines run.
        replica_caches: On Ray, the checkpoint resumed (its replicas' tree caches and routes).
    """

    def __init__(
        self,
        cfg: RunConfig,
        model_dir: Path,
        fmt: ChatFormat,
        cache: TreeCache,
        device: torch.device,
        replica_caches: Path | None = None,
    ) -> None:
        self.cfg, self.model_dir, self.fmt, self.cache, self.device = cfg, model_dir, fmt, cache, device
        self.runtime = self._runtime(cache, replica_caches=replica_caches)
        self.engine = self.runtime.engine
        self.scheduler = self.runtime.scheduler
        self._baseline: Runtime | None = None
        self._baseline_stale = True
        self._weights: Mapping[str, torch.Tensor] | None = None
        self.announced = False  # whether the scheduler took an announcement (reported once)

    def _runtime(
        self,
        cache: TreeCache | None,
        progress: ProgressCallback | None = None,
        replica_caches: Path | None = None,
    ) -> Runtime:
        cfg = self.cfg
        return build_runtime(
            self.model_dir,
            cfg.rollout_config(),
            draft_source=cache if cfg.engine.kind == "torch" else None,  # a server drafts itself
            spec=cfg.spec,
            run_ahead=cfg.spec.run_ahead if cache is not None else None,
            fmt=self.fmt,
            device=self.device,
            seed=cfg.trainer.seed,
            progress=progress,
            engine=cfg.engine,
            ray=cfg.ray if cfg.trainer.backend == "ray" else None,
            replica_caches=replica_caches,
        )

    def save_caches(self, directory: Path) -> None:
        """Write the run's tree caches into a checkpoint ``directory``.

        The driver's cache (:data:`CACHE_FILE`; empty on Ray, where the driver drafts nothing),
        and on Ray each replica's own cache and the routes (:meth:`RayEngine.save_caches`).
        """
        self.cache.save(directory / CACHE_FILE)
        if isinstance(self.engine, RayEngine):
            self.engine.save_caches(directory)

    def push_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load the policy's new weights into the SRT engine (the baseline engine gets them lazily)."""
        self.engine.update_weights(state_dict)
        self._weights = state_dict
        self._baseline_stale = True

    def rollout(
        self,
        specs: Sequence[EpisodeRequest],
        *,
        announce: Sequence[EpisodeRequest] = (),
        progress: ProgressCallback | None = None,
    ) -> StepRollout:
        """Roll out ``specs`` with speculation (SRT), announcing ``announce`` to the run-ahead queue.

        Args:
            specs: This step's episodes.
            announce: The next step's episodes; passed to the scheduler's ``announce`` when
                run-ahead is on for this engine (their output only feeds the tree cache).
            progress: Called with each finished trajectory.

        Returns:
            The trajectories, wall time and speculation counters.
        """
        self.engine.spec_stats(reset=True)  # count this call only (evaluations ran in between)
        self.scheduler.progress = progress
        ahead = announce if self.scheduler.runahead is not None else ()
        t0 = time.perf_counter()
        trajectories = run_with_env_threads(
            self._announce_and_run(specs, ahead), self.cfg.rollout.max_concurrent
        )
        seconds = time.perf_counter() - t0
        extra = _scheduler_figures(self.scheduler)
        return StepRollout(trajectories, seconds, self.engine.spec_stats(reset=True), extra)

    def baseline(
        self, specs: Sequence[EpisodeRequest], progress: ProgressCallback | None = None
    ) -> StepRollout:
        """Roll out ``specs`` again with speculation off (same sampling seeds), for timing only."""
        if self._baseline is None:
            self._baseline = self._runtime(None)
        base = self._baseline
        if self._baseline_stale and self._weights is not None:
            base.engine.update_weights(self._weights)
        self._baseline_stale = False
        base.scheduler.progress = progress
        t0 = time.perf_counter()
        trajectories = run_with_env_threads(base.scheduler.run(specs), self.cfg.rollout.max_concurrent)
        seconds = time.perf_counter() - t0
        return StepRollout(trajectories, seconds, base.engine.spec_stats(reset=True))

    def evaluate(self, progress: ProgressCallback | None = None) -> EvalReport:
        """Held-out evaluation of the current weights: ``trainer.eval_episodes`` tasks of ``env.eval_seeds``.

        The same sampling seeds every time (``trainer.seed``), so evaluations before and after
        training are paired: they differ only through the weights. Sampled at
        ``trainer.eval_temperature`` (``rollout.temperature`` when unset), and decoded as the
        rollouts are (``rollout.constrain_tool_calls``, ``rollout.copy_tool_arguments``): the
        score is the policy's as it is trained and used.
        """
        c = self.cfg
        return run_eval(
            c.env.id,
            self.engine,
            fmt=self.fmt,
            episodes=c.trainer.eval_episodes,
            k=1,
            temperature=c.eval_temperature,
            max_new_tokens=c.rollout.max_new_tokens,
            max_turns=c.env.max_turns,
            max_concurrent=c.rollout.max_concurrent,
            seed=c.trainer.seed,
            first_seed=c.env.eval_seeds.start,
            env_options=dict(c.env.options),
            progress=progress,
            constrain_tool_calls=c.rollout.constrain_tool_calls,
            copy_tool_arguments=c.rollout.copy_tool_arguments,
        )

    async def _announce_and_run(
        self, specs: Sequence[EpisodeRequest], ahead: Sequence[EpisodeRequest]
    ) -> list[Trajectory]:
        if ahead:
            try:
                queued = self.scheduler.announce(list(ahead))
            except Exception:  # run-ahead only warms the cache: never fail a step over it
                log.warning("announcing the next step's prompts failed; continuing without", exc_info=True)
            else:
                self.announced = self.announced or queued > 0
        return await self.scheduler.run(specs)

    def close(self) -> None:
        """Stop the engines' worker threads."""
        self.runtime.close()
        if self._baseline is not None:
            self._baseline.close()


_SCHEDULER_KEYS = ("runahead_", "hit_rate_", "tool_wait_s", "idle_s", "generation_s")


def _scheduler_figures(scheduler: RolloutScheduler) -> dict[str, float]:
    """The scheduler's batch figures (``last_metrics.flat()``) that the trainer does not compute."""
    if scheduler.last_metrics is None:
        return {}
    return {
        f"sched_{k}": float(v)
        for k, v in scheduler.last_metrics.flat().items()
        if k.startswith(_SCHEDULER_KEYS) and isinstance(v, int | float)
    }
