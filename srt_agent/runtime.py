"""The one place that wires a rollout runtime: engine, draft source and scheduler.

``train``, ``eval`` and ``bench`` all roll out through a :class:`Runtime` built here, so an
engine is always given its draft source and speculation options the same way, and a scheduler
always gets the run-ahead queue it was configured with. The engine is the in-process
``TorchEngine``, or an ``SGLangEngine`` client of a server (``engine.kind: sglang``), which drafts
on its side.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from srt_agent.chat.template import ChatFormat
from srt_agent.contracts.draft import DraftSourceProtocol
from srt_agent.distributed.ray_config import RayConfig
from srt_agent.engine.speculation.spec_config import SpecConfig
from srt_agent.rollout.config import RolloutConfig, RunAheadConfig
from srt_agent.rollout.scheduler import ProgressCallback, RolloutScheduler
from srt_agent.serving.engine_config import EngineConfig
from srt_agent.tree_cache import TreeCache
from srt_agent.tree_cache.options import TreeCacheConfig

log = logging.getLogger(__name__)
_DEFAULT_SPEC = SpecConfig()

if TYPE_CHECKING:
    import torch

    from srt_agent.distributed.envs import EnvWorkerPool
    from srt_agent.distributed.ray_engine import RayEngine
    from srt_agent.engine.sequence import Detokenizer
    from srt_agent.engine.torch_engine import TorchEngine
    from srt_agent.serving.client import SGLangEngine


@dataclass
class Runtime:
    """An engine, its draft source and a scheduler over them.

    Attributes:
        engine: The engine (closed by :meth:`close`): in-process, or a server's client.
        fmt: The model's chat format.
        draft_source: What the engine drafts from and reports to (``None``: plain decoding).
        scheduler: Plays episodes against ``engine``.
    """

    engine: TorchEngine | SGLangEngine | RayEngine
    fmt: ChatFormat
    draft_source: DraftSourceProtocol | None
    scheduler: RolloutScheduler
    env_pool: EnvWorkerPool | None = None

    @property
    def cache(self) -> TreeCache | None:
        """The draft source when it is a tree cache."""
        return self.draft_source if isinstance(self.draft_source, TreeCache) else None

    def close(self) -> None:
        """Stop the engine (its worker thread, or its replicas), the env workers and env processes."""
        self.scheduler.close()
        self.engine.close()
        if self.env_pool is not None:
            self.env_pool.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def build_runtime(
    model_dir: str | Path,
    rollout: RolloutConfig,
    *,
    draft_source: DraftSourceProtocol | None = None,
    spec: SpecConfig | None = None,
    run_ahead: RunAheadConfig | None = None,
    fmt: ChatFormat | None = None,
    device: torch.device | str = "cpu",
    seed: int | None = None,
    num_threads: int | None = None,
    progress: ProgressCallback | None = None,
    engine: EngineConfig | None = None,
    ray: RayConfig | None = None,
    dtype: torch.dtype | None = None,
    cuda_graphs: bool | None = None,
    replica_caches: Path | None = None,
    prefix_cache_bytes: int | None = None,
) -> Runtime:
    """Load the model into a :class:`~srt_agent.engine.torch_engine.TorchEngine` (or a server's client).

    Args:
        model_dir: The HF model directory.
        rollout: The scheduler's options; ``max_concurrent`` is also the engine's batch size.
        draft_source: What to speculate from (a :class:`TreeCache`, usually); ``None``: no drafts.
        spec: Speculation options (default: :class:`SpecConfig` ()); ignored without a draft source.
        run_ahead: Run-ahead options; ``None`` or not ``enabled``: no run-ahead queue; ``auto``:
            on unless the engine runs on a CPU. Needs a draft source (run-ahead output only
            feeds it; ``auto`` without one is off).
        fmt: The model's chat format; loaded from ``model_dir`` when ``None``.
        device: Where the engine runs.
        seed: The engine's generator seed (for requests without their own).
        num_threads: ``torch.set_num_threads`` (process-wide) if given.
        progress: Called with each finished trajectory.
        engine: Which engine (default: in-process). With ``kind: sglang`` the server drafts:
            ``draft_source`` and ``spec`` are not used here, ``model_dir`` gives the chat format,
            the context length and the config of weight updates, and run-ahead requests go to
            the server at low priority to fill its drafter.
        ray: Roll out on a Ray cluster (started locally if none is running): engine replicas,
            each drafting from its own tree cache when ``draft_source`` is given (built with the
            draft source's settings and ``spec``; the driver's cache itself is not used), the
            run-ahead queue feeding them, and env workers; see :mod:`srt_agent.distributed`.
        dtype: The in-process engine's dtype (default: bfloat16 on a GPU, float32 on a CPU).
        cuda_graphs: The in-process engine's CUDA graphs (default: on a GPU).
        replica_caches: On Ray, a checkpoint directory whose replica tree caches (and routes) the
            replicas start from.
        prefix_cache_bytes: The in-process engine's budget for parked keys/values (default: the
            engine's, 256 MB).

    Raises:
        ValueError: Run-ahead asked for without a draft source, or (on Ray) a draft source that
            is not a :class:`TreeCache`.
        srt_agent.serving.EngineConnectionError: The server does not answer.
        srt_agent.engine.CheckpointError: ``model_dir`` is not a loadable model.
    """
    fmt = fmt or ChatFormat.from_pretrained(model_dir)
    # "auto" is resolved by the scheduler, which knows the engine's device.
    ahead = run_ahead if run_ahead is not None and run_ahead.enabled is not False else None
    if engine is not None and engine.kind == "sglang":
        if spec is not None and any(
            getattr(spec, f) != getattr(_DEFAULT_SPEC, f) for f in SpecConfig.model_fields
        ):
            # The server drafts by its own options (its launch flags and SRT_SPEC_CONFIG file).
            log.warning(
                "spec options are not used with engine.kind=sglang: the server drafts by the options "
                "it was launched with (srt-agent sglang-serve --config FILE)"
            )
        remote = _connect(model_dir, engine, rollout)
        scheduler = RolloutScheduler(remote, fmt, rollout, runahead=ahead, progress=progress)
        return Runtime(remote, fmt, None, scheduler)

    if ahead is not None and draft_source is None:  # in-process or on Ray: it feeds our caches
        if ahead.enabled is True:
            raise ValueError("run-ahead only feeds a draft source; give one, or leave run-ahead off")
        ahead = None  # "auto" without a draft source: nothing to feed
    if ray is not None:
        return _on_ray(
            model_dir,
            fmt,
            rollout,
            ray,
            cache=_replica_cache(draft_source),
            spec=spec,
            runahead=ahead,
            seed=seed,
            progress=progress,
            saved_caches=replica_caches,
        )
    local = build_engine(
        model_dir,
        max_batch_size=rollout.max_concurrent,
        device=device,
        seed=seed,
        num_threads=num_threads,
        draft_source=draft_source,
        spec=spec,
        dtype=dtype,
        cuda_graphs=cuda_graphs,
        tokenizer=fmt.tokenizer,  # the chat format's: loaded once per run
        prefix_cache_bytes=prefix_cache_bytes,
    )
    if local.graphs is not None:
        # Capture every step shape of the rollout's sampling now, not inside its first batches.
        from srt_agent.contracts.generation import SamplingParams

        sampling = SamplingParams(temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k)
        local.warm_up([sampling], masked=rollout.constrain_tool_calls)
    scheduler = RolloutScheduler(local, fmt, rollout, runahead=ahead, progress=progress)
    return Runtime(local, fmt, draft_source, scheduler)


def build_engine(
    model_dir: str | Path,
    *,
    max_batch_size: int,
    draft_source: DraftSourceProtocol | None = None,
    spec: SpecConfig | None = None,
    device: torch.device | str = "cpu",
    seed: int | None = None,
    num_threads: int | None = None,
    dtype: torch.dtype | None = None,
    cuda_graphs: bool | None = None,
    tokenizer: Detokenizer | None = None,
    prefix_cache_bytes: int | None = None,
) -> TorchEngine:
    """The in-process engine alone (without a scheduler); see :func:`build_runtime`.

    ``tokenizer``: for stop strings (default: loaded from ``model_dir``; a run passes its chat
    format's, so the tokenizer is loaded once).
    """
    from srt_agent.engine.torch_engine import PREFIX_CACHE_BYTES, TorchEngine  # torch: only when built

    return TorchEngine(
        model_dir,
        max_batch_size=max_batch_size,
        device=device,
        seed=seed,
        num_threads=num_threads,
        draft_source=draft_source,
        spec=spec,
        dtype=dtype,
        cuda_graphs=cuda_graphs,
        tokenizer=tokenizer,
        prefix_cache_bytes=PREFIX_CACHE_BYTES if prefix_cache_bytes is None else prefix_cache_bytes,
    )


def _on_ray(
    model_dir: str | Path,
    fmt: ChatFormat,
    rollout: RolloutConfig,
    config: RayConfig,
    *,
    cache: TreeCacheConfig | None,
    spec: SpecConfig | None,
    runahead: RunAheadConfig | None,
    seed: int | None,
    progress: ProgressCallback | None,
    saved_caches: Path | None,
) -> Runtime:
    import ray

    from srt_agent.distributed.envs import EnvWorkerPool
    from srt_agent.distributed.ray_engine import RayEngine

    if not ray.is_initialized():
        # A local cluster fits two sets of replicas (the trainer's baseline keeps a second one).
        local_cpus = max(os.cpu_count() or 1, math.ceil(2 * config.replicas * config.replica_cpus))
        ray.init(
            address=config.address,
            num_cpus=config.num_cpus or (None if config.address else local_cpus),
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    engine = RayEngine(
        model_dir,
        config,
        max_batch_size=rollout.max_concurrent,
        cache=cache,
        spec=spec,
        seed=seed or 0,
        saved_caches=saved_caches,
    )
    pool = EnvWorkerPool(config.env_workers, rollout) if config.env_workers else None
    factory = pool.make if pool is not None else None
    # The run-ahead queue lives here; its requests reach the replica their task is routed to,
    # so they fill the tree cache that the task's live requests draft from.
    scheduler = RolloutScheduler(
        engine, fmt, rollout, runahead=runahead, progress=progress, env_factory=factory
    )
    return Runtime(engine, fmt, None, scheduler, pool)


def _replica_cache(source: DraftSourceProtocol | None) -> TreeCacheConfig | None:
    """The tree cache settings Ray replicas build their caches with (each has its own cache).

    Raises:
        ValueError: ``source`` is not a :class:`TreeCache`: a custom draft source cannot be
            rebuilt inside the replicas.
    """
    if source is None:
        return None
    if not isinstance(source, TreeCache):
        raise ValueError(
            f"on Ray each engine replica drafts from a tree cache of its own; a {type(source).__name__} "
            "draft source cannot be copied into the replicas (use a TreeCache, or roll out in-process)"
        )
    return source.config


def _connect(model_dir: str | Path, config: EngineConfig, rollout: RolloutConfig) -> SGLangEngine:
    from srt_agent.engine.hf_checkpoint import read_config
    from srt_agent.serving.client import SGLangEngine

    assert config.url is not None  # EngineConfig checks it for kind sglang
    return SGLangEngine(
        config.url,
        max_context=read_config(model_dir).max_position_embeddings,
        model_dir=model_dir,
        timeout_s=config.timeout_s,
        retries=config.retries,
        max_connections=max(config.max_connections, rollout.max_concurrent),
        weights_dir=config.weights_dir,
        weight_sync=config.weight_sync,
    )
