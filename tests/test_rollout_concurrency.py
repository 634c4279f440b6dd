"""Concurrency: tool waits overlap other episodes' generation; bounds, order and progress."""

from __future__ import annotations

import asyncio
import io
import time

from rich.console import Console
from scripted_engine import ScriptedEngine
from test_rollout_support import NAPS, SCRIPT_ENV, episode_of, tiny_format, turn_of

from srt_agent.contracts.generation import GenerationRequest
from srt_agent.rollout import (
    EpisodeRequest,
    RolloutConfig,
    RolloutProgress,
    RolloutScheduler,
    Trajectory,
    run_rollouts,
)
from srt_agent.tooling.parser import format_tool_call

NAP_S = 0.3


def napping_engine(delay: float | None = None) -> ScriptedEngine:
    """Turn 0 naps NAP_S seconds in a tool (labelled with the episode), turn 1 says DONE."""

    def respond(req: GenerationRequest) -> str:
        if turn_of(req) == 0:
            return format_tool_call("nap", {"seconds": NAP_S, "label": episode_of(req)})
        return "DONE"

    # Staggered delays (episode i waits 0.02 * i) put episodes out of phase, so some generate
    # while others nap.
    def stagger(req: GenerationRequest) -> float:
        return 0.02 * int(episode_of(req).rsplit("/", 2)[1]) if delay is None else delay

    return ScriptedEngine(tiny_format(), respond, delay_s=stagger)


def test_tool_waits_overlap_and_generation_proceeds_while_others_wait() -> None:
    NAPS.clear()
    engine = napping_engine()
    specs = [EpisodeRequest(SCRIPT_ENV, seed=i) for i in range(8)]
    t0 = time.perf_counter()
    trajectories = run_rollouts(engine, tiny_format(), specs, max_concurrent=8)
    wall = time.perf_counter() - t0
    assert len(trajectories) == 8 and all(t.status == "ok" and t.success for t in trajectories)
    # Serially: 8 naps of 0.3 s plus 16 generations of up to 0.14 s (> 3 s).
    assert wall < 1.5, f"8 episodes took {wall:.2f} s: tool waits did not overlap"
    assert len(NAPS) == 8 and engine.max_in_flight >= 4
    # Some episode's generation ran entirely inside another episode's nap.
    inside = [
        (c.request.request_id, label)
        for c in engine.calls
        for label, start, end in NAPS
        if label != episode_of(c.request) and start < c.start and c.end < end
    ]
    assert inside, "no generation ran while another episode waited on its tool"
    assert all(t.env_s >= NAP_S for t in trajectories)  # the nap is env (tool) time


def test_max_concurrent_bounds_episodes_in_flight_and_queue_time_is_recorded() -> None:
    engine = napping_engine(delay=0.01)
    specs = [EpisodeRequest(SCRIPT_ENV, seed=i) for i in range(6)]
    trajectories = run_rollouts(engine, tiny_format(), specs, RolloutConfig(max_concurrent=2))
    assert [t.status for t in trajectories] == ["ok"] * 6
    assert engine.max_in_flight <= 2
    # The last pair waited for two rounds of (nap + generations) before it could start.
    assert trajectories[-1].queue_s > 2 * NAP_S and trajectories[0].queue_s < 0.1


def test_results_come_back_in_input_order_and_progress_sees_each_episode() -> None:
    # Later episodes finish first (shorter delays), yet results follow the input order.
    fmt = tiny_format()
    engine = ScriptedEngine(fmt, lambda req: "DONE", delay_s=lambda req: 0.05 - 0.01 * int(episode_of(req)))
    specs = [EpisodeRequest(SCRIPT_ENV, seed=i, episode_id=str(i)) for i in range(5)]
    finished: list[str] = []
    trajectories = run_rollouts(engine, fmt, specs, progress=lambda t: finished.append(t.episode_id))
    assert [t.episode_id for t in trajectories] == ["0", "1", "2", "3", "4"]
    assert finished == ["4", "3", "2", "1", "0"]

    out = io.StringIO()
    with RolloutProgress(5, description="test", console=Console(file=out, width=120)) as bar:
        again = run_rollouts(engine, fmt, specs, progress=bar)
    assert bar.counts == {"ok": 5, "truncated": 0, "failed": 0} and bar.successes == 5
    assert bar.tokens == sum(t.generated_tokens for t in again) > 0 and "5/5" in out.getvalue()


def test_a_raising_progress_callback_does_not_lose_the_rollout() -> None:
    def broken(t: Trajectory) -> None:
        raise RuntimeError("display bug")

    trajectories = run_rollouts(
        ScriptedEngine(tiny_format(), lambda r: "DONE"),
        tiny_format(),
        [EpisodeRequest(SCRIPT_ENV, seed=0)],
        progress=broken,
    )
    assert trajectories[0].status == "ok"


def test_scheduler_runs_inside_an_existing_event_loop() -> None:
    scheduler = RolloutScheduler(ScriptedEngine(tiny_format(), lambda r: "DONE"), tiny_format())

    async def main() -> list[Trajectory]:
        # Two batches on the same loop: the concurrency bound is created per run.
        first = await scheduler.run([EpisodeRequest(SCRIPT_ENV, seed=0)])
        return first + await scheduler.run([EpisodeRequest(SCRIPT_ENV, seed=1)])

    trajectories = asyncio.run(main())
    assert [t.status for t in trajectories] == ["ok", "ok"] and trajectories[0].task_id != ""
