"""Envs in Ray env workers: a proxy env for the driver, and the pool that places episodes.

The rollout scheduler plays an episode against whatever env its factory makes. With env workers,
that is a :class:`RemoteEnv`: ``reset`` and ``step`` run in an
:class:`~srt_agent.distributed.actors.EnvWorker` actor (tools included: a slow tool waits there,
and the driver's event loop only awaits its result), episodes spread round-robin over the workers.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from typing import Any, SupportsFloat

import gymnasium as gym

from srt_agent.distributed.actors import EnvWorker
from srt_agent.rollout.config import EpisodeSpec

__all__ = ["EnvWorkerPool", "RemoteEnv"]


class RemoteEnv(gym.Env[Any, str]):
    """One episode's env, living in an env worker; a drop-in for the scheduler."""

    def __init__(self, worker: Any, key: str) -> None:
        import ray

        self._ray: Any = ray
        self._worker, self._key = worker, key

    def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """``reset`` in the worker."""
        obs, info = self._ray.get(self._worker.reset.remote(self._key, seed, options))
        return obs, info

    def step(self, action: str) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """``step`` in the worker (its tools run there)."""
        obs, reward, terminated, truncated, info = self._ray.get(self._worker.step.remote(self._key, action))
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        """Close the env in the worker."""
        self._ray.get(self._worker.close.remote(self._key))


class EnvWorkerPool:
    """``workers`` env-worker actors; :meth:`make` is an env factory for the rollout scheduler.

    Args:
        workers: Actors to start (``ray.init`` must have run).
    """

    def __init__(self, workers: int) -> None:
        import ray

        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self._ray: Any = ray
        remote: Any = ray.remote
        actor = remote(num_cpus=0, max_concurrency=256)(EnvWorker)
        self.workers = [actor.remote() for _ in range(workers)]
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def make(self, spec: EpisodeSpec) -> RemoteEnv:
        """The env of ``spec``, made in the next worker (round-robin)."""
        with self._lock:
            n = next(self._ids)
        worker = self.workers[n % len(self.workers)]
        key = f"{spec.episode_id}#{n}"
        self._ray.get(worker.make.remote(key, spec.env_id, dict(spec.env_options)))
        return RemoteEnv(worker, key)

    def close(self) -> None:
        """Stop the workers."""
        for w in self.workers:
            self._ray.kill(w)
