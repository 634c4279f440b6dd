"""What runs inside the Ray actors: an engine replica, and an env worker.

Plain classes; :mod:`srt_agent.distributed.ray_engine` makes them actors with ``ray.remote``, so this
module imports without Ray and its logic is tested in-process too.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from srt_agent.contracts.generation import GenerationOutput, GenerationRequest
from srt_agent.contracts.speculation import SpecStats
from srt_agent.engine.speculation.spec_config import SpecConfig
from srt_agent.tree_cache.cache_types import TreeCacheConfig

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
    """

    def __init__(
        self,
        model_dir: str | Path,
        max_batch_size: int,
        cache: TreeCacheConfig | None = None,
        spec: SpecConfig | None = None,
        seed: int = 0,
        threads: int = 1,
    ) -> None:
        from srt_agent.engine.torch_engine import TorchEngine
        from srt_agent.tree_cache import TreeCache

        self.cache = TreeCache(cache) if cache is not None else None
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

    def cache_states(self) -> int:
        """Conversation states in the replica's tree cache."""
        return len(self.cache) if self.cache is not None else 0

    def ping(self) -> bool:
        """Liveness."""
        return True


class EnvWorker:
    """Envs of many episodes, stepped here (tools included) instead of in the driver."""

    def __init__(self) -> None:
        import srt_agent.envs  # noqa: F401 - registers the built-in envs in this process

        self._envs: dict[str, Any] = {}

    def make(self, key: str, env_id: str, options: Mapping[str, Any]) -> None:
        """Make the env of episode ``key``."""
        from srt_agent.env.registration import make

        self._envs[key] = make(env_id, **dict(options))

    def reset(self, key: str, seed: int | None, options: Mapping[str, Any] | None) -> tuple[Any, Any]:
        """``env.reset`` of episode ``key``."""
        obs, info = self._envs[key].reset(seed=seed, options=options)
        return obs, info

    async def step(self, key: str, action: str) -> tuple[Any, ...]:
        """``env.step`` of episode ``key``; async tools run on this actor's event loop."""
        from srt_agent.env.multi_turn import async_step

        return tuple(await async_step(self._envs[key], action))

    def close(self, key: str) -> None:
        """Close and forget episode ``key``'s env."""
        env = self._envs.pop(key, None)
        if env is not None:
            env.close()
