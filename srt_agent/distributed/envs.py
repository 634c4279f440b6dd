"""Envs in Ray env workers: a proxy env for the driver, and the pool that places episodes.

The rollout scheduler plays an episode against whatever env its factory makes. With env workers,
that is a :class:`RemoteEnv`: ``reset`` and ``step`` run in an
:class:`~srt_agent.distributed.actors.EnvWorker` actor (tools included: a slow tool waits there,
and the driver's event loop only awaits its result), episodes spread round-robin over the workers.
``rollout.env_isolation`` (or the env's registered choice) holds there as in one process: with
``process``, each episode's env runs in a process of its own under its worker, so an env that
crashes or exits fails its episode and not the others that worker holds.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Mapping
from typing import Any, SupportsFloat

import gymnasium as gym

from srt_agent.distributed.actors import EnvWorker, EscapedExit
from srt_agent.env.registration import Isolation, resolve_isolation
from srt_agent.errors import FAULTS, SrtAgentError, describe_fault
from srt_agent.rollout.config import EpisodeRequest, RolloutConfig
from srt_agent.rollout.judged import JudgedAtClose

__all__ = ["EnvWorkerLost", "EnvWorkerPool", "RemoteEnv"]


class EnvWorkerLost(SrtAgentError, RuntimeError):
    """The env worker holding an episode's env died; that episode fails, the pool replaces the worker."""


def _get(ray: Any, ref: Any) -> Any:
    """``ray.get``, raising what the env raised (not Ray's wrapper of it), or :class:`EnvWorkerLost`.

    The episode's reason then reads as it does in one process (``env raised RuntimeError: ...``).
    """
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, EscapedExit):
            raise cause.original() from None
        if isinstance(cause, BaseException):
            raise cause from None
        raise
    except ray.exceptions.RayActorError as exc:
        raise EnvWorkerLost(
            f"the env worker holding this episode died: {describe_fault(exc, first_line=True)}"
        ) from None


class RemoteEnv(JudgedAtClose, gym.Env[Any, str]):
    """One episode's env, living in an env worker; a drop-in for the scheduler.

    ``is_success`` is asked in the worker when the env closes (the judge needs the env, which
    ``close`` drops), with the rewards and info this proxy saw; the rollout reads the answer after
    ``close``, as it does of an env in its own process.
    """

    def __init__(self, worker: Any, key: str) -> None:
        import ray

        self._ray: Any = ray
        self._worker, self._key = worker, key
        self._start_judging()

    def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """``reset`` in the worker."""
        self._start_judging()
        obs, info = _get(self._ray, self._worker.reset.remote(self._key, seed, options))
        self._saw_info(info)
        return obs, info

    def step(self, action: str) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """``step`` in the worker (its tools run there)."""
        result = _get(self._ray, self._worker.step.remote(self._key, action))
        self._saw_step(result)
        obs, reward, terminated, truncated, info = result
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        """Ask the env's judge, then close the env in the worker."""
        try:
            self._verdict = (
                self._total,
                _get(self._ray, self._worker.judge.remote(self._key, self._total, self._info)),
            )
        except EnvWorkerLost:
            raise
        except FAULTS as exc:  # the env's judge raised: reported when the rollout asks
            self._judge_error = exc
        _get(self._ray, self._worker.close.remote(self._key))


class EnvWorkerPool:
    """``workers`` env-worker actors; :meth:`make` is an env factory for the rollout scheduler.

    Args:
        workers: Actors to start (``ray.init`` must have run).
        rollout: The run's rollout settings: ``env_isolation`` (unset: each env's registered
            choice) decides which envs run in processes of their own under their worker, with
            the deadlines and observation cap the rollout uses (default: ``RolloutConfig()``'s).
    """

    def __init__(self, workers: int, rollout: RolloutConfig | None = None) -> None:
        import ray

        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        rollout = rollout or RolloutConfig()
        self.isolation = rollout.env_isolation
        processes = {
            "size": max(1, -(-rollout.max_concurrent // workers)),  # a worker's share of the episodes
            "step_timeout_s": rollout.env_step_timeout_s,
            "setup_timeout_s": rollout.env_setup_timeout_s,
            "max_observation_chars": rollout.max_observation_chars,
        }
        self._ray: Any = ray
        remote: Any = ray.remote
        self._actor = remote(num_cpus=0, max_concurrency=256)(EnvWorker)
        self._processes = processes
        self._registered: dict[str, Isolation] = {}  # env id -> its registered isolation
        self.workers = [self._new_worker() for _ in range(workers)]
        self.replaced = 0
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def make(self, spec: EpisodeRequest) -> RemoteEnv:
        """The env of ``spec``, made in the next worker (round-robin).

        A worker found dead is replaced by a fresh one and the env made there: a dead worker fails
        the episodes it held, not the ones that come after.
        """
        with self._lock:
            n = next(self._ids)
        slot = n % len(self.workers)
        key = f"{spec.episode_id}#{n}"
        process = resolve_isolation(spec.env_id, self.isolation, self._registered) == "process"
        for _ in range(2):
            worker = self.workers[slot]
            try:
                _get(self._ray, worker.make.remote(key, spec.env_id, dict(spec.env_options), process))
            except EnvWorkerLost:
                self._replace(slot, worker)
                continue
            return RemoteEnv(worker, key)
        raise EnvWorkerLost(f"env worker {slot} died twice in a row while making {spec.episode_id}")

    def _new_worker(self) -> Any:
        return self._actor.remote(self._processes)

    def _replace(self, slot: int, dead: Any) -> None:
        with self._lock:
            if self.workers[slot] is dead:  # not already replaced by another episode
                self.workers[slot] = self._new_worker()
                self.replaced += 1

    def close(self) -> None:
        """Stop the workers (and the env processes they started)."""
        with contextlib.suppress(Exception):  # a dead worker: nothing of its own left to stop
            self._ray.get([w.shutdown.remote() for w in self.workers], timeout=30)
        for w in self.workers:
            self._ray.kill(w)
