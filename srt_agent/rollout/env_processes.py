"""Envs in worker processes (``env.isolation: process``): a crash, an exit or a hang costs one episode.

In-process env code shares the trainer's process: a segfault in a C extension, an ``os._exit`` or
unbounded allocation takes the batch and the in-memory tree cache with it, and a call stuck in one
C call keeps its thread until the process ends. Here each episode's env lives in a worker process
of its own for the episode's length (:class:`ProcessEnv`, a proxy the rollout plays as it would
the env), and every call runs under its deadline. A worker that crashes, exits or overruns is
killed; its episode fails with the reason (the signal, the exit code, the deadline) and the pool
starts another worker for the next episode. Workers are reused across episodes (their imports paid
once), at most ``size`` kept idle, and retired after ``max_episodes`` so leaks in env code stay
bounded.

The worker is :mod:`srt_agent.isolation`'s (``python -c``, frames over pipes), not
multiprocessing's: see there why. The env's class must be importable by the worker: it gets the
env's registration (its Gymnasium spec) from this process, so an env registered in a module works,
one defined in a script's ``__main__`` does not.
"""

from __future__ import annotations

import contextlib
import functools
import pickle
import threading
from collections.abc import Callable, Mapping
from typing import Any, SupportsFloat

import gymnasium as gym

from srt_agent.errors import FAULTS, SrtAgentError
from srt_agent.isolation import CallTimeout, RemoteError, Worker, WorkerDied, describe_exit, remote_error
from srt_agent.rollout.config import EpisodeRequest
from srt_agent.rollout.judged import JudgedAtClose

__all__ = ["EnvProcessDied", "EnvProcessPool", "ProcessEnv"]


class EnvProcessDied(SrtAgentError, RuntimeError):
    """The process holding an episode's env ended during a call (a crash, an exit, or a kill)."""


# ------------------------------------------------------------------------------ the worker's side
# Module-level functions, so a call pickles as a reference plus its arguments. One env per worker.
_ENV: gym.Env[Any, str] | None = None


def _remote_make(
    env_id: str, registration: gym.envs.registration.EnvSpec | None, options: dict[str, Any]
) -> None:
    global _ENV
    from srt_agent.env.registration import make, registered_envs

    registered_envs()  # the built-ins first, so the parent's registration below never overrides one
    if _ENV is not None:  # the previous episode's env was not closed (its episode failed): drop it
        env, _ENV = _ENV, None
        with contextlib.suppress(*FAULTS):
            env.close()
    if registration is not None and registration.id not in gym.registry:
        gym.registry[registration.id] = registration  # registered in the parent, not here
    _ENV = make(env_id, **options)


def _env() -> gym.Env[Any, str]:
    if _ENV is None:
        raise RuntimeError("no env in this worker (make failed or it was closed)")
    return _ENV


def _capped(obs: Any, max_chars: int | None) -> Any:
    """``obs`` with each message cut to ``max_chars`` here, so a huge one never crosses the pipe.

    The rollout would cut it the same way; anything that is not messages goes as it is, to be
    refused there.
    """
    from srt_agent.chat.messages import Message, cap_message

    if max_chars is None or not isinstance(obs, tuple | list):
        return obs
    return type(obs)(cap_message(m, max_chars) if isinstance(m, Message) else m for m in obs)


def _remote_reset(seed: int | None, options: dict[str, Any] | None, max_chars: int | None) -> tuple[Any, Any]:
    obs, info = _env().reset(seed=seed, options=options)
    return _capped(obs, max_chars), info


def _remote_step(action: str, max_chars: int | None) -> tuple[Any, ...]:
    result = tuple(_env().step(action))
    return (_capped(result[0], max_chars), *result[1:]) if result else result


def _remote_judge(total: float, info: dict[str, Any]) -> bool | None:
    judge = getattr(_env().unwrapped, "is_success", None)
    return bool(judge(total, info)) if callable(judge) else None


def _remote_close() -> None:
    global _ENV
    env, _ENV = _ENV, None
    if env is not None:
        env.close()


# ------------------------------------------------------------------------------ the parent's side
class ProcessEnv(JudgedAtClose, gym.Env[Any, str]):
    """One episode's env, living in a worker process of :class:`EnvProcessPool`; a drop-in for the rollout.

    Each call waits at most its deadline (``step`` and ``close``: the pool's ``step_timeout_s``;
    ``reset``: ``setup_timeout_s``). At a deadline, or when the worker dies, the worker is killed
    and the env is gone: later calls raise :class:`EnvProcessDied`, ``close`` does nothing.

    ``is_success`` is asked in the worker when the env closes (the judge needs the env), with the
    rewards and info this proxy saw; the rollout reads the answer after ``close``.
    """

    self_timed = True  # each call enforces its own deadline (the rollout gives its thread a grace)

    def __init__(self, pool: EnvProcessPool, worker: Worker, episode_id: str) -> None:
        self._pool, self._worker, self.episode_id = pool, worker, episode_id
        self._dead: str | None = None  # why the worker is gone
        self._start_judging()

    def _call(self, fn: Callable[..., Any], *args: Any, timeout: float | None, what: str) -> Any:
        if self._dead is not None:
            raise EnvProcessDied(f"the env's process is gone ({self._dead}); {what} not attempted")
        worker = self._worker
        try:
            status, payload = worker.call(pickle.dumps(("call", functools.partial(fn, *args))), timeout)
        except CallTimeout:
            self._lose(f"{what} overran its {timeout:g} s deadline and its process was killed")
            raise
        except WorkerDied as exc:
            reason = describe_exit(exc.exit_code)
            self._lose(reason)
            raise EnvProcessDied(f"the env's process died during {what}: {reason}") from None
        except FAULTS:  # the request did not pickle, or the pipe broke: the worker's state is unknown
            self._lose(f"{what} could not be sent")
            raise
        if status != "ok":
            error = remote_error(payload)
            raise error.original if error.original is not None else error
        return payload

    def _lose(self, why: str) -> None:
        self._dead = why
        self._pool.discard(self._worker)

    def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """``reset`` in the worker, within ``setup_timeout_s``."""
        self._start_judging()
        opts = None if options is None else dict(options)
        limit = self._pool.max_observation_chars
        obs, info = self._call(
            _remote_reset, seed, opts, limit, timeout=self._pool.setup_timeout_s, what="reset"
        )
        self._saw_info(info)
        return obs, info

    def step(self, action: str) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """``step`` in the worker (its tools run there), within ``step_timeout_s``."""
        limit = self._pool.max_observation_chars
        result = self._call(_remote_step, action, limit, timeout=self._pool.step_timeout_s, what="step")
        self._saw_step(result)
        return result  # type: ignore[no-any-return]

    def close(self) -> None:
        """Ask the env's judge, close the env and give the worker back (nothing if it is gone)."""
        if self._dead is not None:
            return
        try:
            verdict = self._call(
                _remote_judge, self._total, self._info, timeout=self._pool.step_timeout_s, what="is_success"
            )
            self._verdict = (self._total, verdict)
        except RemoteError as exc:  # the env's judge raised: reported when the rollout asks
            self._judge_error = exc
        except (CallTimeout, EnvProcessDied):
            return
        except FAULTS as exc:  # the judge raised something that rebuilt here (a ValueError, ...)
            self._judge_error = RemoteError(str(exc), exc)
        self._call(_remote_close, timeout=self._pool.step_timeout_s, what="close")
        self._dead = "closed"
        self._pool.release(self._worker)


class EnvProcessPool:
    """Worker processes for envs; calling it makes an episode's :class:`ProcessEnv` (an env factory).

    Args:
        size: Most idle workers kept between episodes (the rollout's concurrency: that many are
            busy at once; more are started on demand and the excess retired).
        step_timeout_s: Deadline of each ``step`` and ``close`` (``None``: none).
        setup_timeout_s: Deadline of ``make`` and ``reset``, which may download or build (``None``:
            none). A cold worker's start-up (importing srt-agent and gymnasium) does not count.
        max_episodes: Episodes a worker serves before it is retired.
        max_observation_chars: Env messages are cut to this many characters in the worker, as the
            rollout cuts them (``rollout.max_observation_chars``), so a huge one is never copied
            here (``None``: not cut there).
    """

    self_timed = True  # the envs it makes enforce their own deadlines

    def __init__(
        self,
        size: int,
        *,
        step_timeout_s: float | None = 60.0,
        setup_timeout_s: float | None = 300.0,
        max_episodes: int = 100,
        max_observation_chars: int | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size, self.max_episodes, self.max_observation_chars = size, max_episodes, max_observation_chars
        self.step_timeout_s, self.setup_timeout_s = step_timeout_s, setup_timeout_s
        self._idle: list[Worker] = []
        self._busy: set[Worker] = set()
        self._episodes: dict[Worker, int] = {}
        self._lock = threading.Lock()
        self.started = 0  # worker processes started
        self.lost = 0  # workers killed: crashed, exited or overran
        self._closed = False

    def __call__(self, request: EpisodeRequest) -> ProcessEnv:
        """The env of ``request``, made in a worker (within ``setup_timeout_s``).

        Raises:
            What ``make`` raised (an unknown id, bad options), :class:`EnvProcessDied`, or
            :class:`~srt_agent.isolation.CallTimeout`.
        """
        from srt_agent.env.registration import check_env_id

        env_id = check_env_id(request.env_id)  # also registers a module's or an ecosystem's env here
        registration = gym.spec(env_id)
        worker = self._acquire()
        env = ProcessEnv(self, worker, request.episode_id)
        try:
            env._call(
                _remote_make,
                env_id,
                registration,
                dict(request.env_options),
                timeout=self.setup_timeout_s,
                what="make",
            )
        except BaseException:
            if env._dead is None:  # make raised in a healthy worker (a lost one is already discarded)
                env._dead = "make failed"
                self.release(worker)
            raise
        return env

    def _acquire(self) -> Worker:
        with self._lock:
            if self._closed:
                raise RuntimeError("the env process pool is closed")
            worker = self._idle.pop() if self._idle else None
        if worker is None:
            worker = Worker()
            with self._lock:
                self.started += 1
            try:
                worker.prepare((__name__,))  # imports before any deadline: start-up is not the env's
            except FAULTS:
                worker.kill()
                raise
        with self._lock:
            self._busy.add(worker)
            self._episodes[worker] = self._episodes.get(worker, 0) + 1
        return worker

    def release(self, worker: Worker) -> None:
        """Give back a healthy worker after its episode (kept idle, or retired)."""
        with self._lock:
            self._busy.discard(worker)
            keep = (
                not self._closed
                and worker.proc.poll() is None
                and self._episodes.get(worker, 0) < self.max_episodes
                and len(self._idle) < self.size
            )
            if keep:
                self._idle.append(worker)
            else:
                self._episodes.pop(worker, None)
        if not keep:
            worker.kill()

    def discard(self, worker: Worker) -> None:
        """Kill a worker that crashed, exited or overran (its episode has failed)."""
        with self._lock:
            self._busy.discard(worker)
            self._episodes.pop(worker, None)
            self.lost += 1
        worker.kill()

    @property
    def busy(self) -> int:
        """Workers holding an episode's env now (0 between batches: none is leaked)."""
        with self._lock:
            return len(self._busy)

    @property
    def alive(self) -> int:
        """Worker processes alive now (idle and busy)."""
        with self._lock:
            return len(self._idle) + len(self._busy)

    def close(self) -> None:
        """Stop every worker (busy ones too: their episodes are over when the rollout closes the pool)."""
        with self._lock:
            self._closed = True
            workers = [*self._idle, *self._busy]
            self._idle.clear()
            self._busy.clear()
            self._episodes.clear()
        for worker in workers:
            worker.kill()

    def __enter__(self) -> EnvProcessPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
