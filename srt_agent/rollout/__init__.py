"""Rollouts: many multi-turn episodes played concurrently against an engine, token-in/token-out.

* :class:`EpisodeSpec` / :class:`RolloutConfig`: what to play and how;
* :class:`RolloutScheduler` (async) and :func:`run_rollouts` (sync): play them;
  :meth:`RolloutScheduler.rollout` / :func:`rollout_sync` also return the batch's
  :class:`RolloutMetrics` (speculation, draft hits, run-ahead, time split);
* :class:`RunAheadConfig`: run-ahead into the tree cache while episodes wait on tools
  (:meth:`RolloutScheduler.announce` for the trainer's coming prompts);
* :class:`Trajectory`: one episode's exact tokens, loss mask, logprobs, rewards and timings;
* :func:`write_trace` / :func:`read_trace`: the per-turn JSONL trace (schema ``srt-trace/1``);
* :class:`RolloutProgress`: a rich progress bar; :class:`ScriptedEngine`: a test double.
"""

from srt_agent.rollout.config import EpisodeSpec, RolloutConfig, sampling_seed
from srt_agent.rollout.episode import EpisodeHooks
from srt_agent.rollout.metrics import RolloutMetrics, RunAheadStats
from srt_agent.rollout.progress import RolloutProgress
from srt_agent.rollout.runahead import RunAhead, RunAheadConfig
from srt_agent.rollout.scheduler import (
    ProgressCallback,
    RolloutBatch,
    RolloutScheduler,
    rollout_sync,
    run_rollouts,
)
from srt_agent.rollout.testing import ScriptedEngine
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
from srt_agent.rollout.trajectory import Status, Trajectory, TurnRecord, json_safe

__all__ = [
    "TRACE_SCHEMA",
    "EpisodeHooks",
    "EpisodeSpec",
    "ProgressCallback",
    "RolloutBatch",
    "RolloutConfig",
    "RolloutMetrics",
    "RolloutProgress",
    "RolloutScheduler",
    "RunAhead",
    "RunAheadConfig",
    "RunAheadStats",
    "ScriptedEngine",
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
