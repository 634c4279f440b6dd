"""Rollouts: many multi-turn episodes played concurrently against an engine, token-in/token-out.

* :class:`EpisodeRequest` / :class:`RolloutConfig`: what to play and how;
* :class:`RolloutScheduler` (async) and :func:`run_rollouts` (sync): play them;
  :meth:`RolloutScheduler.rollout` / :func:`rollout_sync` also return the batch's
  :class:`RolloutMetrics` (speculation, draft hits, run-ahead, time split);
* :class:`RunAheadConfig`: run-ahead into the tree cache while episodes wait on tools
  (:meth:`RolloutScheduler.announce` for the trainer's coming prompts);
* :class:`Trajectory`: one episode's exact tokens, loss mask, logprobs, rewards and timings;
* :func:`write_trace` / :func:`read_trace`: the per-turn JSONL trace (schema ``srt-trace/1``);
* :class:`RolloutProgress`: a rich progress bar.
"""

# Exports load on first use (PEP 562): ``srt_agent.rollout.config`` is part of the run config, and
# parsing a config must not import torch and transformers, which the scheduler's modules do.
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from srt_agent.contracts.trajectory import Status, Trajectory, TurnRecord, json_safe
    from srt_agent.rollout.config import EpisodeRequest, RolloutConfig, RunAheadConfig, sampling_seed
    from srt_agent.rollout.episode import EpisodeHooks
    from srt_agent.rollout.metrics import RolloutMetrics, RunAheadStats
    from srt_agent.rollout.progress import RolloutProgress
    from srt_agent.rollout.runahead import RunAhead
    from srt_agent.rollout.scheduler import (
        ProgressCallback,
        RolloutBatch,
        RolloutScheduler,
        rollout_sync,
        run_rollouts,
    )
    from srt_agent.rollout.tool_memo import ToolMemo
    from srt_agent.rollout.trace import (
        TRACE_SCHEMA,
        TraceFormatError,
        TraceTurn,
        episode_prefix,
        iter_trace,
        read_trace,
        trace_turns,
        write_trace,
    )

_EXPORTS = {
    "EpisodeRequest": "srt_agent.rollout.config",
    "RolloutConfig": "srt_agent.rollout.config",
    "RunAheadConfig": "srt_agent.rollout.config",
    "sampling_seed": "srt_agent.rollout.config",
    "EpisodeHooks": "srt_agent.rollout.episode",
    "RolloutMetrics": "srt_agent.rollout.metrics",
    "RunAheadStats": "srt_agent.rollout.metrics",
    "RolloutProgress": "srt_agent.rollout.progress",
    "RunAhead": "srt_agent.rollout.runahead",
    "ProgressCallback": "srt_agent.rollout.scheduler",
    "RolloutBatch": "srt_agent.rollout.scheduler",
    "RolloutScheduler": "srt_agent.rollout.scheduler",
    "rollout_sync": "srt_agent.rollout.scheduler",
    "run_rollouts": "srt_agent.rollout.scheduler",
    "ToolMemo": "srt_agent.rollout.tool_memo",
    "TRACE_SCHEMA": "srt_agent.rollout.trace",
    "TraceFormatError": "srt_agent.rollout.trace",
    "TraceTurn": "srt_agent.rollout.trace",
    "episode_prefix": "srt_agent.rollout.trace",
    "iter_trace": "srt_agent.rollout.trace",
    "read_trace": "srt_agent.rollout.trace",
    "trace_turns": "srt_agent.rollout.trace",
    "write_trace": "srt_agent.rollout.trace",
    "Status": "srt_agent.contracts.trajectory",
    "Trajectory": "srt_agent.contracts.trajectory",
    "TurnRecord": "srt_agent.contracts.trajectory",
    "json_safe": "srt_agent.contracts.trajectory",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "TRACE_SCHEMA",
    "EpisodeHooks",
    "EpisodeRequest",
    "ProgressCallback",
    "RolloutBatch",
    "RolloutConfig",
    "RolloutMetrics",
    "RolloutProgress",
    "RolloutScheduler",
    "RunAhead",
    "RunAheadConfig",
    "RunAheadStats",
    "Status",
    "ToolMemo",
    "TraceFormatError",
    "TraceTurn",
    "Trajectory",
    "TurnRecord",
    "episode_prefix",
    "iter_trace",
    "json_safe",
    "read_trace",
    "rollout_sync",
    "run_rollouts",
    "sampling_seed",
    "trace_turns",
    "write_trace",
]
