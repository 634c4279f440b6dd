"""What runs inside the Ray actors: an engine replica, and an env worker.

Plain classes; :mod:`srt_agent.distributed.ray_engine` makes them actors with ``ray.remote``, so this
module imports without Ray and its logic is tested in-process too.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from srt_agent.contracts.generation import GenerationOutput, GenerationRequest
from srt_agent.contracts.speculation import SpecStats
from srt_agent.engine.speculation.spec_config import SpecConfig
from srt_agent.errors import SrtAgentError
from srt_agent.isolation import await_in_thread
from srt_agent.rollout.env_processes import EnvProcessPool, ProcessEnv
from srt_agent.tree_cache.options import TreeCacheConfig

__all__ = ["EngineReplica", "EnvWorker"]


class EngineReplica:
    """One engine replica: a ``TorchEngine`` drafting from its own tree cache.

    Args:
        model_dir: The model.
        max_batch_size: The engine's batch.
        cache: The replica's tree cache settings (the run's ``spec.cache``); ``None``: no tree
            cache, no drafts (SRT off).
        spec: The engine's speculation settings (the run's ``spec``: draft budget, cost model);
            ``None``: the defaults.
        seed: The engine's seed (requests carry their own).
        threads: Torch threads.
        cache_file: A file :meth:`cache_bytes` wrote (a checkpoint's): the tree cache starts from it.
    """

    def __init__(
        self,
        model_dir: str | Path,
        max_batch_size: int,
        cache: TreeCacheConfig | None = None,
        spec: SpecConfig | None = None,
        seed: int = 0,
        threads: int = 1,
        cache_file: bytes | None = None,
    ) -> None:
        from srt_agent.engine.torch_engine import TorchEngine
        from srt_agent.tree_cache import TreeCache

        self.cache = TreeCache(cache) if cache is not None else None
        if cache is not None and cache_file is not None:
            with tempfile.TemporaryDirectory() as tmp:  # bytes, not a path: the driver may be elsewhere
                path = Path(tmp) / "tree_cache.npz"
                path.write_bytes(cache_file)
                self.cache = TreeCache.load(path, cache)
        self.engine = TorchEngine(
            model_dir,
            max_batch_size=max_batch_size,
            draft_source=self.cache,
            spec=spec,
            seed=seed,
            num_threads=threads,
        )

    def options(self) -> tuple[TreeCacheConfig | None, SpecConfig]:
        """The tree cache's and the engine's speculation settings this replica runs with."""
        return (self.cache.config if self.cache is not None else None), self.engine.spec

    async def generate(self, request: GenerationRequest) -> GenerationOutput:
        """One request, joining the replica's running batch."""
        return await self.engine.agenerate(request)

    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Load new weights (the tree cache stays: verification keeps drafts exact)."""
        self.engine.update_weights(state_dict)

    def spec_stats(self, reset: bool = False) -> SpecStats:
        """The replica's speculation counters."""
        return self.engine.spec_stats(reset=reset)

    def cache_bytes(self) -> bytes | None:
        """The tree cache as a :meth:`TreeCache.save` file's bytes (``None``: no cache)."""
        if self.cache is None:
            return None
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "tree_cache.npz"
            self.cache.save(path)
            return path.read_bytes()

    def cache_states(self) -> int:
        """Conversation states in the replica's tree cache."""
        return len(self.cache) if self.cache is not None else 0

    def ping(self) -> bool:
        """Liveness."""
        return True


class EscapedExit(SrtAgentError):
    """``SystemExit`` or ``KeyboardInterrupt`` raised by env code in a worker, as an ordinary exception.

    Raised as themselves they would end the worker (Ray takes ``SystemExit`` in a task as the actor
    exiting), and every episode on it with them. The driver raises the original again, so the
    episode's reason reads as it does in one process.
    """

    def __init__(self, kind: str, args: tuple[Any, ...]) -> None:
        super().__init__(kind, args)
        self.kind, self.exit_args = kind, args

    def original(self) -> BaseException:
        """The exception env code raised."""
        return (
            SystemExit(*self.exit_args) if self.kind == "SystemExit" else KeyboardInterrupt(*self.exit_args)
        )


async def _contained(fn: Callable[[], Any]) -> Any:
    """Run env code in a thread of its own, its exits carried back as :class:`EscapedExit`.

    A thread per call, not the loop's pool: a hung env call (the driver has given up on it at its
    deadline) would keep a pool thread, and a few of them would stall every other episode here.
    """
    try:
        return await await_in_thread(fn, None, name="srt-env-worker")
    except (SystemExit, KeyboardInterrupt) as exc:
        raise EscapedExit(type(exc).__name__, exc.args) from None


class EnvWorker:
    """Envs of many episodes, stepped here (tools included) instead of in the driver.

    Args:
        processes: Settings of this worker's own env processes (``EnvProcessPool``'s keyword
            arguments: ``size``, the deadlines, ``max_observation_chars``), used by episodes made
            with ``process=True``: each such env lives in a process of its own under this worker, so
            an env that crashes or exits costs its episode, not every episode this worker holds.
    """

    def __init__(self, processes: Mapping[str, Any] | None = None) -> None:
        import srt_agent.envs  # noqa: F401 - registers the built-in envs in this process

        self._envs: dict[str, Any] = {}
        self._process_settings = dict(processes or {"size": 1})
        self._processes: EnvProcessPool | None = None  # started by the first isolated episode

    async def make(self, key: str, env_id: str, options: Mapping[str, Any], process: bool = False) -> None:
        """Make the env of episode ``key``: here, or with ``process`` in an env process of this worker."""
        if process:
            from srt_agent.rollout.config import EpisodeRequest

            if self._processes is None:
                self._processes = EnvProcessPool(**self._process_settings)
            pool, request = self._processes, EpisodeRequest(env_id, episode_id=key, env_options=dict(options))
            self._envs[key] = await _contained(lambda: pool(request))
            return
        from srt_agent.env.registration import make

        self._envs[key] = await _contained(lambda: make(env_id, **dict(options)))

    async def reset(self, key: str, seed: int | None, options: Mapping[str, Any] | None) -> tuple[Any, Any]:
        """``env.reset`` of episode ``key``."""
        env = self._envs[key]
        obs, info = await _contained(lambda: env.reset(seed=seed, options=options))
        return obs, info

    async def step(self, key: str, action: str) -> tuple[Any, ...]:
        """``env.step`` of episode ``key`` (its tools run here, each under its own timeout)."""
        env = self._envs[key]
        return tuple(await _contained(lambda: env.step(action)))

    async def judge(self, key: str, total: float, info: Mapping[str, Any]) -> bool | None:
        """Episode ``key``'s env's own success judgement (``is_success``); ``None`` if it has none.

        An env in a process of its own is judged there as it closes (the judge needs the env), so
        it is closed first; the ``close`` that follows finds it closed.
        """
        env = self._envs[key]
        if isinstance(env, ProcessEnv):
            await _contained(env.close)
            return bool(env.is_success(total, dict(info)))
        judge = getattr(env.unwrapped, "is_success", None)
        if not callable(judge):
            return None
        return bool(await _contained(lambda: judge(total, dict(info))))

    async def close(self, key: str) -> None:
        """Close and forget episode ``key``'s env."""
        env = self._envs.pop(key, None)
        if env is not None:
            await _contained(env.close)

    async def shutdown(self) -> None:
        """Stop this worker's env processes, if it started any."""
        pool, self._processes = self._processes, None
        if pool is not None:
            await await_in_thread(pool.close, None, name="srt-env-worker")
