"""Per-batch rollout metrics: speculation figures, draft hits by source, run-ahead work, time split.

:class:`RolloutMetrics` is what one :meth:`RolloutScheduler.rollout` call measured, as frozen data
with a flat JSON form (:meth:`RolloutMetrics.flat`). Engine-side figures come from the difference of
two :meth:`TorchEngine.spec_stats` snapshots taken around the batch (never a reset, so other readers
of the counters are not disturbed); engines without speculation counters report zeros there.

The wall-clock split is measured by the scheduler (:class:`Timeline`): at every instant the batch is
in exactly one of three phases, so the three add up to the wall time:

* ``generation``: at least one live request is on the engine;
* ``tool_wait``: no live request is on the engine, but at least one episode is in an env step (every
  episode waits on its tools or env);
* ``idle``: neither (chat-template rendering, env construction, the event loop).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from srt_agent.contracts.speculation import SpecStats
from srt_agent.contracts.trajectory import Trajectory

SOURCES = ("exact", "task", "global")
"""Draft sources of the tree cache reported per batch (``run-ahead`` is counted per accepted token)."""


@dataclass(frozen=True)
class RunAheadStats:
    """Run-ahead work during one batch (see :mod:`srt_agent.rollout.runahead`).

    Attributes:
        announced: Jobs queued by :meth:`RolloutScheduler.announce` (first turns of coming prompts),
            counted when announced (usually between batches, so in no batch's figures).
        predicted: Jobs queued for a post-tool state whose tool results were known from the memo.
        prediction_checks: Predictions compared with the real observation once the tool returned.
        prediction_hits: Of those, predictions equal to the real observation (same state key).
        started: Run-ahead requests submitted to the engine.
        completed: Of those, requests that ran to a stop or their token limit.
        preempted: Requests that gave their engine row to a live request.
        cancelled: Requests cancelled (a live request reached their state too soon, or the batch ended).
        dropped: Queued jobs dropped before starting (their state went live first, or the queue was full).
        tokens: Tokens the run-ahead requests generated (only the tree cache saw them).
    """

    announced: int = 0
    predicted: int = 0
    prediction_checks: int = 0
    prediction_hits: int = 0
    started: int = 0
    completed: int = 0
    preempted: int = 0
    cancelled: int = 0
    dropped: int = 0
    tokens: int = 0

    def minus(self, before: RunAheadStats) -> RunAheadStats:
        """The counts accumulated since ``before`` (an earlier snapshot)."""
        mine, theirs = asdict(self), asdict(before)
        return RunAheadStats(**{k: mine[k] - theirs[k] for k in mine})


@dataclass(frozen=True)
class RolloutMetrics:
    """What one rollout batch measured (see the module docstring for the time split).

    Attributes:
        episodes: Episodes in the batch.
        turns: Generated (live) turns.
        live_tokens: Tokens sampled by live requests (those in the trajectories).
        live_forward_passes: Forward passes the engine reported for the live requests.
        spec: The engine's speculation counters over the batch (live and run-ahead requests alike).
        runahead: Run-ahead work over the batch.
        wall_s: Wall seconds of the batch.
        generation_s: Seconds with a live request on the engine.
        tool_wait_s: Seconds with no live request on the engine and an episode in an env step.
        idle_s: The rest of ``wall_s``.
    """

    episodes: int = 0
    turns: int = 0
    live_tokens: int = 0
    live_forward_passes: int = 0
    spec: SpecStats = field(default_factory=SpecStats)
    runahead: RunAheadStats = field(default_factory=RunAheadStats)
    wall_s: float = 0.0
    generation_s: float = 0.0
    tool_wait_s: float = 0.0
    idle_s: float = 0.0

    @property
    def tokens_per_forward(self) -> float:
        """Live tokens per live forward pass (1.0 without speculation): the rollout's speculation gain."""
        return self.live_tokens / self.live_forward_passes if self.live_forward_passes else 0.0

    @property
    def draft_lookups(self) -> int:
        """Draft lookups that reached the verifier's choice (non-empty drafts plus empty ones)."""
        return sum(self.spec.drafts_by_source.values()) + self.spec.empty_drafts

    def hit_rate(self, source: str) -> float:
        """Share of draft lookups answered by ``source`` (``exact``, ``task`` or ``global``)."""
        lookups = self.draft_lookups
        return self.spec.drafts_by_source.get(source, 0) / lookups if lookups else 0.0

    @property
    def runahead_accepted_share(self) -> float:
        """Share of accepted draft tokens whose counts came only from run-ahead content."""
        s = self.spec
        return s.runahead_nodes_accepted / s.nodes_accepted if s.nodes_accepted else 0.0

    def flat(self) -> dict[str, Any]:
        """One level of JSON scalars (the acceptance histogram as ``acceptance_hist_<k>``).

        Keys: ``episodes``, ``turns``, ``live_tokens``, ``live_forward_passes``,
        ``tokens_per_forward`` (live), ``engine_tokens``, ``engine_tokens_per_forward`` (live and
        run-ahead rows), ``engine_runahead_tokens`` (every token run-ahead rows generated, cancelled
        requests included), ``target_forwards``, ``verify_forwards``, ``prefill_forwards``,
        ``nodes_drafted``, ``nodes_accepted``, ``acceptance_rate``, ``mean_accepted``,
        ``acceptance_hist_<k>``, ``draft_lookups``, ``drafts_<source>`` and ``hit_rate_<source>``
        for exact/task/global, ``runahead_accepted_tokens``, ``runahead_accepted_share``,
        ``runahead_<counter>`` for every :class:`RunAheadStats` field, ``probes``, ``draft_errors``,
        and the seconds ``wall_s``, ``generation_s``, ``tool_wait_s``, ``idle_s``, ``draft_s``
        (lookups), ``forward_s`` (decode and verify forwards), ``verify_s`` (drawing targets and
        walking trees), ``prefill_s`` (prefill forwards), ``engine_idle_s`` (the engine had nothing
        to run).
        """
        s = self.spec
        out: dict[str, Any] = {
            "episodes": self.episodes,
            "turns": self.turns,
            "live_tokens": self.live_tokens,
            "live_forward_passes": self.live_forward_passes,
            "tokens_per_forward": round(self.tokens_per_forward, 4),
            "engine_tokens": s.tokens,
            "engine_runahead_tokens": s.runahead_tokens,
            "engine_tokens_per_forward": round(s.tokens_per_forward, 4),
            "target_forwards": s.target_forwards,
            "verify_forwards": s.verify_forwards,
            "prefill_forwards": s.prefill_forwards,
            "nodes_drafted": s.nodes_drafted,
            "nodes_accepted": s.nodes_accepted,
            "acceptance_rate": round(s.acceptance_rate, 4),
            "mean_accepted": round(s.mean_accepted, 4),
            "draft_lookups": self.draft_lookups,
            "runahead_accepted_tokens": s.runahead_nodes_accepted,
            "runahead_accepted_share": round(self.runahead_accepted_share, 4),
            "probes": s.probes,
            "draft_errors": s.draft_errors,
        }
        out.update({f"acceptance_hist_{k}": n for k, n in enumerate(s.acceptance_histogram)})
        for source in SOURCES:
            out[f"drafts_{source}"] = s.drafts_by_source.get(source, 0)
            out[f"hit_rate_{source}"] = round(self.hit_rate(source), 4)
        out.update({f"runahead_{k}": v for k, v in asdict(self.runahead).items()})
        seconds = {
            "wall_s": self.wall_s,
            "generation_s": self.generation_s,
            "tool_wait_s": self.tool_wait_s,
            "idle_s": self.idle_s,
            "draft_s": s.draft_s,
            "forward_s": s.forward_s,
            "verify_s": s.verify_s,
            "prefill_s": s.prefill_s,
            "engine_idle_s": s.idle_s,
        }
        out.update({k: round(v, 4) for k, v in seconds.items()})
        return out


class Timeline:
    """Splits wall time into generation / tool wait / idle from live-request and env-step counts.

    Call :meth:`enter` and :meth:`leave` with ``"live"`` (a live request is on the engine) or
    ``"env"`` (an episode is in an env step) from the event loop; :meth:`split` closes the interval.
    """

    def __init__(self) -> None:
        self._counts = {"live": 0, "env": 0}
        self._seconds = {"generation": 0.0, "tool_wait": 0.0, "idle": 0.0}
        self._since = time.perf_counter()

    def _phase(self) -> str:
        if self._counts["live"]:
            return "generation"
        return "tool_wait" if self._counts["env"] else "idle"

    def _advance(self) -> None:
        now = time.perf_counter()
        self._seconds[self._phase()] += now - self._since
        self._since = now

    def enter(self, kind: str) -> None:
        """One more live request (``"live"``) or env step (``"env"``) in flight."""
        self._advance()
        self._counts[kind] += 1

    def leave(self, kind: str) -> None:
        """One fewer live request or env step in flight."""
        self._advance()
        self._counts[kind] -= 1

    @property
    def live(self) -> int:
        """Live requests on the engine now."""
        return self._counts["live"]

    def split(self) -> Mapping[str, float]:
        """Seconds per phase so far (``generation``, ``tool_wait``, ``idle``)."""
        self._advance()
        return dict(self._seconds)


def batch_metrics(
    trajectories: list[Trajectory],
    *,
    spec: SpecStats,
    runahead: RunAheadStats,
    wall_s: float,
    split: Mapping[str, float],
) -> RolloutMetrics:
    """Assemble :class:`RolloutMetrics` from a batch's trajectories and the measured counters."""
    return RolloutMetrics(
        episodes=len(trajectories),
        turns=sum(t.num_turns for t in trajectories),
        live_tokens=sum(t.generated_tokens for t in trajectories),
        live_forward_passes=sum(t.forward_passes for t in trajectories),
        spec=spec,
        runahead=runahead,
        wall_s=wall_s,
        generation_s=split.get("generation", 0.0),
        tool_wait_s=split.get("tool_wait", 0.0),
        idle_s=split.get("idle", 0.0),
    )
