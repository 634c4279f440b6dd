"""``RayEngine``: engine replicas as Ray actors behind the engine protocol, with cache-aware routing.

Each replica is an :class:`~srt_agent.distributed.actors.EngineReplica` actor (its own model and
tree cache). A request goes to the replica its task is routed to (:class:`~.router.Router`), so
every sample and turn of a task drafts from the same tree cache. A replica that dies is replaced
by a fresh actor (given the latest weights), its tasks are rerouted to the new one, and the
request is sent again: a request carries its seed, so the retried turn samples the same tokens
and the episode goes on as if nothing happened.

Weights go to the replicas through Ray's object store: one ``ray.put`` per update, read by every
replica (on a GPU cluster, NCCL broadcast from the learner's ranks is the usual path instead).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srt_agent.contracts.generation import GenerationOutput, GenerationRequest, check_room
from srt_agent.contracts.speculation import SpecStats, spec_sum
from srt_agent.distributed.actors import EngineReplica
from srt_agent.distributed.ray_config import RayConfig
from srt_agent.distributed.router import Router
from srt_agent.engine.speculation.spec_config import SpecConfig
from srt_agent.tree_cache.options import TreeCacheConfig

if TYPE_CHECKING:
    import torch

__all__ = ["RayEngine", "replica_args"]

log = logging.getLogger(__name__)


def replica_args(
    model_dir: str | Path,
    config: RayConfig,
    *,
    max_batch_size: int,
    cache: TreeCacheConfig | None,
    spec: SpecConfig | None,
    seed: int,
) -> dict[str, Any]:
    """The keyword arguments of every :class:`EngineReplica` a :class:`RayEngine` starts (replacements too).

    Args:
        model_dir: The model.
        config: Gives each replica's torch threads.
        max_batch_size: Each replica's batch.
        cache: The run's ``spec.cache`` (``None``: no tree cache, no drafts).
        spec: The run's engine options (``spec``: draft budget, cost model; ``None``: the defaults).
        seed: The replicas' engine seed.
    """
    return {
        "model_dir": str(model_dir),
        "max_batch_size": max_batch_size,
        "cache": cache,
        "spec": spec if spec is not None else SpecConfig(),
        "seed": seed,
        "threads": config.replica_threads,
    }


ROUTES_FILE = "tree_cache.routes.json"
"""Beside the replicas' caches: which replica each task was routed to."""


def replica_cache_name(index: int) -> str:
    """The file name of replica ``index``'s tree cache in a checkpoint."""
    return f"tree_cache.replica{index}.npz"


def replica_cache_files(directory: Path) -> list[Path]:
    """The replica tree caches saved in ``directory``, by replica index (none: ``[]``)."""
    found: list[Path] = []
    while (directory / replica_cache_name(len(found))).is_file():
        found.append(directory / replica_cache_name(len(found)))
    return found


class RayEngine:
    """Engine replicas on a Ray cluster (``ray.init`` must have run).

    Args:
        model_dir: The model every replica loads.
        config: Replicas, routing and retries.
        max_batch_size: Each replica's batch.
        cache: Each replica's tree cache settings (the run's ``spec.cache``); ``None``: replicas
            do not draft (SRT off).
        spec: Each replica's speculation settings (the run's ``spec``); ``None``: the defaults.
        seed: Seed of the replicas' engines (requests carry their own).
        saved_caches: A directory :meth:`save_caches` wrote (a checkpoint): each replica starts
            from its saved tree cache, and each task is routed back to the replica that holds
            its history.
    """

    device = "cpu"  # where the replicas run (Ray's local and CPU-only clusters); run-ahead's "auto" reads it

    def __init__(
        self,
        model_dir: str | Path,
        config: RayConfig,
        *,
        max_batch_size: int,
        cache: TreeCacheConfig | None = None,
        spec: SpecConfig | None = None,
        seed: int = 0,
        saved_caches: Path | None = None,
    ) -> None:
        import ray

        from srt_agent.engine.hf_checkpoint import read_config

        self._ray: Any = ray  # Ray's stubs do not type actor handles' methods
        self.model_dir = str(model_dir)
        self.config = config
        self._max_context = read_config(model_dir).max_position_embeddings
        remote: Any = ray.remote
        self._actor = remote(num_cpus=config.replica_cpus, max_concurrency=max(64, 4 * max_batch_size))(
            EngineReplica
        )
        self._args = replica_args(
            model_dir, config, max_batch_size=max_batch_size, cache=cache, spec=spec, seed=seed
        )
        self._lock = threading.Lock()
        self._weights: Any = None  # the latest weights' object ref, for replacements
        self.replaced = 0
        self.router = Router(config.replicas, config.routing)
        saved: list[Path] = []
        if saved_caches is not None and cache is not None:
            saved = replica_cache_files(saved_caches)
            routes = saved_caches / ROUTES_FILE
            if routes.is_file():
                self.router.restore(json.loads(routes.read_text()))
        if saved and len(saved) != config.replicas:
            log.warning(
                "%d replica tree caches saved, %d replicas now: the first %d start from theirs",
                len(saved), config.replicas, min(len(saved), config.replicas),
            )  # fmt: skip
        files = [f.read_bytes() for f in saved[: config.replicas]]
        self.replicas = [
            self._actor.remote(**self._args, cache_file=files[i] if i < len(files) else None)
            for i in range(config.replicas)
        ]
        try:  # fail here, saying why, if a replica cannot start (no CPU left to place it, say)
            ray.get([r.ping.remote() for r in self.replicas], timeout=config.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.close()
            free = self._ray.available_resources().get("CPU", 0.0)
            raise RuntimeError(
                f"{config.replicas} engine replicas did not start within {config.start_timeout_s:.0f} s; "
                f"the cluster has {free:g} CPUs free and each replica asks for {config.replica_cpus:g} "
                "(lower ray.replica_cpus or ray.replicas, or give the cluster more CPUs: ray.num_cpus)"
            ) from None

    @property
    def max_context(self) -> int:
        """Longest sequence (prompt + generation) the model holds."""
        return self._max_context

    async def agenerate(self, request: GenerationRequest) -> GenerationOutput:
        """Send the request to its task's replica; on a replica's death, replace it and resend."""
        check_room(request, self._max_context)
        key = request.task_id or request.state_key
        for attempt in range(self.config.max_retries + 1):
            index = self.router.pick(key)
            replica = self.replicas[index]
            try:
                output: GenerationOutput = await replica.generate.remote(request)
                return output
            except self._ray.exceptions.RayActorError:
                if attempt == self.config.max_retries:
                    raise
                log.warning("replica %d died; replacing it and resending %s", index, request.request_id)
                self._replace(index, replica)
        raise AssertionError("unreachable")  # pragma: no cover

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        """Run requests to completion across the replicas, outputs in request order."""

        async def run() -> list[GenerationOutput]:
            return list(await asyncio.gather(*(self.agenerate(r) for r in requests)))

        return asyncio.run(run())

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Put the weights in the object store once; every replica loads them."""
        ref = self._ray.put({k: v.detach().to("cpu") for k, v in state_dict.items()})
        with self._lock:
            self._weights = ref
        self._each("update_weights", ref)  # a dead replica is replaced, and the new one loads them

    def replica_options(self) -> list[tuple[TreeCacheConfig | None, SpecConfig]]:
        """Each replica's tree cache and speculation settings, as the replicas report them."""
        options: list[tuple[TreeCacheConfig | None, SpecConfig]] = self._each("options")
        return options

    def spec_stats(self, reset: bool = False) -> SpecStats:
        """The replicas' speculation counters, added up."""
        return spec_sum(self._each("spec_stats", reset))

    def save_caches(self, directory: Path) -> list[Path]:
        """Write each replica's tree cache into ``directory`` (``tree_cache.replica<i>.npz``).

        The files a checkpoint keeps, so that resuming gives every replica its own cache back.
        """
        blobs = self._each("cache_bytes")
        paths = []
        for i, blob in enumerate(blobs):
            if blob is not None:
                paths.append(directory / replica_cache_name(i))
                paths[-1].write_bytes(blob)
        if paths:
            (directory / ROUTES_FILE).write_text(json.dumps(self.router.owners(), sort_keys=True))
        return paths

    def cache_states(self) -> list[int]:
        """Conversation states in each replica's tree cache."""
        return list(self._each("cache_states"))

    def _each(self, method: str, *args: Any) -> list[Any]:
        """Call ``method`` on every replica; a replica found dead is replaced and asked instead.

        A replica can die with no request of its own in flight (nothing would have replaced it
        yet): a question to every replica must not fail the run for it.
        """
        with self._lock:
            replicas = list(self.replicas)
        refs = [getattr(r, method).remote(*args) for r in replicas]
        try:
            return list(self._ray.get(refs))
        except self._ray.exceptions.RayActorError:
            pass
        out = []
        for index, (replica, ref) in enumerate(zip(replicas, refs, strict=True)):
            try:
                out.append(self._ray.get(ref))
            except self._ray.exceptions.RayActorError:
                log.warning("replica %d died; replacing it", index)
                self._replace(index, replica)
                out.append(self._ray.get(getattr(self.replicas[index], method).remote(*args)))
        return out

    def close(self) -> None:
        """Stop the replicas."""
        for r in self.replicas:
            self._ray.kill(r)

    def _replace(self, index: int, dead: Any) -> None:
        with self._lock:
            if self.replicas[index] is not dead:  # another request replaced it already
                return
            fresh = self._actor.remote(**self._args)
            if self._weights is not None:
                fresh.update_weights.remote(self._weights)  # queued before any generate
            self.replicas[index] = fresh
            self.replaced += 1
