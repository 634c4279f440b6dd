"""Rollouts: many multi-turn episodes played concurrently against an engine, token-in/token-out.

* :class:`EpisodeSpec` / :class:`RolloutConfig`: what to play and how;
* :class:`RolloutScheduler` (async) and :func:`run_rollouts` (sync): play them;
* :class:`Trajectory`: one episode's exact tokens, loss mask, logprobs, rewards and timings;
* :func:`write_trace` / :func:`read_trace`: the per-turn JSONL trace (schema ``srt-trace/1``);
* :class:`RolloutProgress`: a rich progress bar; :class:`ScriptedEngine`: a test double.
"""

from srt_agent.rollout.config import EpisodeSpec, RolloutConfig, sampling_seed
from srt_agent.rollout.progress import RolloutProgress
from srt_agent.rollout.scheduler import ProgressCallback, RolloutScheduler, run_rollouts
from srt_agent.rollout.testing import ScriptedEngine
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
    "EpisodeSpec",
    "ProgressCallback",
    "RolloutConfig",
    "RolloutProgress",
    "RolloutScheduler",
    "ScriptedEngine",
    "Status",
    "TraceFormatError",
    "TraceTurn",
    "Trajectory",
    "TurnRecord",
    "episode_prefix",
    "iter_trace",
    "json_safe",
    "read_trace",
    "run_rollouts",
    "sampling_seed",
    "trace_turns",
    "write_trace",
]
