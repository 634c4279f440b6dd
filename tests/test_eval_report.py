"""Evaluation figures: pass^k on hand-made cases and against brute force, the flat JSON, seeds."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from srt_agent.chat.messages import assistant, user
from srt_agent.contracts.speculation import SpecStats
from srt_agent.evaluation import EVAL_SEED_END, EvalReport, eval_episodes, pass_hat_k, summarize
from srt_agent.rollout import Trajectory, TurnRecord
from srt_agent.train.step_metrics import rollout_metrics

T, F = True, False


def test_pass_hat_k_on_hand_made_cases() -> None:
    # n = k: a task counts only when every trial succeeded.
    assert pass_hat_k([[T, T], [T, F], [F, F], [T, T]], 2) == 0.5
    assert pass_hat_k([[T, T], [T, F], [F, F], [T, T]], 1) == 5 / 8  # pass^1 = success rate
    # n > k: unbiased C(c, k) / C(n, k): 2 of 4 trials succeeded -> 1 of the 6 pairs is all-success.
    assert pass_hat_k([[T, F, T, F]], 2) == pytest.approx(1 / 6)
    assert pass_hat_k([[T, T, T, F]], 3) == pytest.approx(1 / 4)
    assert pass_hat_k([[T] * 5, [F] * 5], 5) == 0.5
    with pytest.raises(ValueError, match="task 1 has 1 trials; pass\\^2 needs at least 2"):
        pass_hat_k([[T, T], [T]], 2)
    with pytest.raises(ValueError, match="k must be >= 1"):
        pass_hat_k([[T]], 0)
    with pytest.raises(ValueError, match="at least one task"):
        pass_hat_k([], 1)


@given(st.lists(st.lists(st.booleans(), min_size=1, max_size=6), min_size=1, max_size=4), st.integers(1, 6))
def test_pass_hat_k_equals_the_mean_over_every_k_subset_of_trials(tasks: list[list[bool]], k: int) -> None:
    if any(len(t) < k for t in tasks):
        return
    # The estimator is unbiased because it is exactly the average of "all k succeed" over every
    # way of choosing k of the n trials.
    brute = [
        sum(all(c) for c in itertools.combinations(t, k)) / len(list(itertools.combinations(t, k)))
        for t in tasks
    ]
    assert pass_hat_k(tasks, k) == pytest.approx(sum(brute) / len(brute))


def traj(
    seed: int, trial: int, *, success: bool, status: str = "ok", reason: str = "", kind: str | None = None
) -> Trajectory:
    ids = (1, 2, 3, 4, 5, 6)
    return Trajectory(
        episode_id=f"e/{seed}/{trial}", env_id="srt/Calculator-v0", task_id=f"task-{seed}", seed=seed,
        trial=trial, token_ids=ids, loss_mask=(0, 0, 1, 1, 0, 1), logprobs=(0, 0, -0.1, -0.2, 0, -0.3),
        turns=(
            TurnRecord(0, 2, 4, "k0", "stop", 0.0, 1, 11, 0.01),
            TurnRecord(1, 5, 6, "k1", "stop", float(success), 1, 12, 0.02),
        ),
        total_reward=float(success), success=success, terminated=status == "ok",
        truncated=status == "truncated", status=status, reason=reason,  # type: ignore[arg-type]
        tool_calls=2, tool_errors=1, generation_s=0.5, env_s=0.25,
        messages=(user("q"), assistant('<tool_call>{"name": "calculator", "arguments": {}}</tool_call>'),
                  assistant("2" if success else '<tool_call>{"name": calc</tool_call>')),
        final_info={"task_kind": kind} if kind else {},
    )  # fmt: skip


def report() -> EvalReport:
    trajectories = [
        traj(0, 0, success=T),
        traj(0, 1, success=T),
        traj(1, 0, success=T),
        traj(1, 1, success=F, status="truncated", reason="env truncated: max_turns=10 reached"),
        traj(2, 0, success=F, status="failed", reason="env raised ValueError: x in step"),
        traj(2, 1, success=F, status="failed", reason="env raised ValueError: y in step"),
    ]
    return summarize(trajectories, k=2, model="m", temperature=1.0, seed=0, wall_s=2.0)


def test_summary_counts_figures_over_all_episodes() -> None:
    r = report()
    assert (r.tasks, r.k, r.episodes, r.first_env_seed) == (3, 2, 6, 0)
    assert r.success_rate == 0.5 and r.pass_hat[0] == 0.5 and r.pass_hat[1] == pytest.approx(1 / 3)
    assert (r.ok, r.truncated, r.failed) == (3, 1, 2)
    assert r.reasons == {"env truncated": 1, "env raised ValueError": 2}
    assert (r.tokens_generated, r.forward_passes, r.tool_calls, r.tool_errors) == (18, 12, 12, 6)
    assert r.mean_turns == 2 and r.tokens_per_s == 9.0 and r.tokens_per_forward == 1.5
    assert r.generation_s == 3.0 and r.env_s == 1.5 and len(r.trajectories) == 6
    # Each unsolved episode's last turn is a call block that does not decode.
    assert (r.garbled_turns, r.assistant_turns) == (3, 12) and r.flat()["garbled_turn_rate"] == 0.25
    with pytest.raises(ValueError, match="pass\\^2 needs at least 2"):
        summarize([traj(0, 0, success=T)], k=2, model="m", temperature=1.0, seed=0, wall_s=1.0)


def test_flat_report_is_one_level_of_scalars_and_the_table_renders() -> None:
    flat = report().flat()
    assert all(v is None or isinstance(v, str | int | float) for v in flat.values())
    assert json.loads(json.dumps(flat)) == flat
    assert flat["schema"] == "srt-eval/1" and flat["pass_hat_k"] == flat["pass_hat_2"]
    assert flat["pass_hat_1"] == flat["success_rate"] == 0.5
    expected = {
        "env_id", "model", "tasks", "k", "episodes", "temperature", "constrained_tool_calls", "seed",
        "copied_tool_arguments", "oracle_prefix", "first_env_seed", "success_rate", "pass_hat_k",
        "pass_hat_1", "pass_hat_2", "mean_reward", "mean_progress", "mean_turns",
        "tokens_generated", "mean_tokens_per_episode", "forward_passes", "tokens_per_forward",
        "tool_calls", "tool_errors", "mean_tool_calls", "garbled_turns", "garbled_turn_rate", "ok",
        "truncated", "failed", "wall_s",
        "generation_s", "env_s", "tokens_per_s", "schema", "ending_terminated", "ending_env_truncated",
        "ending_env_raised_valueerror",
    }  # fmt: skip
    assert set(flat) == expected
    assert flat["constrained_tool_calls"] is False and flat["copied_tool_arguments"] is False
    assert flat["mean_progress"] is None  # the env reports no progress
    out = io.StringIO()
    Console(file=out, width=100).print(report().table())
    text = out.getvalue()
    assert "pass^2" in text and "33.3%" in text and "env raised ValueError" in text
    assert "grammar" not in text
    constrained = dataclasses.replace(report(), constrained=True, copied=True)
    assert constrained.flat()["constrained_tool_calls"] is True
    assert constrained.flat()["copied_tool_arguments"] is True
    out = io.StringIO()
    Console(file=out, width=100).print(constrained.table())
    assert "decoded under the tools' grammar" in out.getvalue()
    assert "copied from the conversation" in out.getvalue()


def test_progress_the_env_reports_is_averaged_over_the_episodes_that_report_it() -> None:
    ts = [traj(0, 0, success=T), traj(0, 1, success=F), traj(1, 0, success=F)]
    ts[0] = dataclasses.replace(ts[0], final_info={"progress": 1.0})
    ts[1] = dataclasses.replace(ts[1], final_info={"progress": 0.5})
    r = summarize(ts, k=1, model="m", temperature=1.0, seed=0, wall_s=1.0)
    assert r.mean_progress == 0.75 and r.flat()["mean_progress"] == 0.75
    out = io.StringIO()
    Console(file=out, width=100).print(r.table())
    assert "share of the goal reached" in out.getvalue() and "75.0%" in out.getvalue()


def test_labelled_tasks_get_per_kind_figures_and_endings_their_shares() -> None:
    trajectories = [
        traj(0, 0, success=T, kind="cancel"),
        traj(0, 1, success=T, kind="cancel"),
        traj(1, 0, success=T, kind="info"),
        traj(1, 1, success=F, status="truncated", reason="max_turns: 30 reached", kind="info"),
        traj(2, 0, success=F, kind="info"),
        traj(2, 1, success=F, status="failed", reason="internal error: x"),  # failed before reset
        traj(3, 0, success=F, status="failed", reason="internal error: y"),
        traj(3, 1, success=F, status="failed", reason="internal error: z"),
    ]
    r = summarize(trajectories, k=2, model="m", temperature=1.0, seed=0, wall_s=2.0)
    assert set(r.kinds) == {"cancel", "info", "unlabelled"}  # seed 2's failed trial is an info task
    cancel, info = r.kinds["cancel"], r.kinds["info"]
    assert (cancel.episodes, cancel.success_rate, cancel.pass_hat) == (2, 1.0, (1.0, 1.0))
    assert info.episodes == 4 and info.success_rate == 0.25
    assert info.pass_hat == (0.25, 0.0)  # task 1: 1 of 2, task 2: 0 of 2
    assert r.kinds["unlabelled"].episodes == 2
    assert r.endings == {"terminated": 4, "max_turns": 1, "internal error": 3}
    flat = r.flat()
    assert flat["kind_cancel_success_rate"] == 1.0 and flat["kind_info_episodes"] == 4
    assert flat["kind_cancel_pass_hat_2"] == 1.0 and flat["kind_info_mean_tool_calls"] == 2.0
    assert flat["ending_terminated"] == 0.5 and flat["ending_max_turns"] == 0.125
    out = io.StringIO()
    Console(file=out, width=120).print(r.table())
    assert "ended: terminated" in out.getvalue() and "cancel (2)" in out.getvalue()
    unlabelled = summarize(trajectories[:2], k=2, model="m", temperature=1.0, seed=0, wall_s=1.0)
    assert set(unlabelled.kinds) == {"cancel"}
    plain = summarize([traj(0, 0, success=T)], k=1, model="m", temperature=1.0, seed=0, wall_s=1.0)
    assert plain.kinds == {} and not any(key.startswith("kind_") for key in plain.flat())


def test_eval_seeds_stay_below_the_demonstration_seeds() -> None:
    from srt_agent.recipe.demos import DEMO_SEED_BASE

    assert EVAL_SEED_END == DEMO_SEED_BASE
    specs = eval_episodes("srt/Calculator-v0", 3, 2, first_seed=5)
    assert [(s.seed, s.trial) for s in specs] == [(5, 0), (5, 1), (6, 0), (6, 1), (7, 0), (7, 1)]
    assert len({s.episode_id for s in specs}) == 6
    with pytest.raises(ValueError, match="training demonstrations"):
        eval_episodes("srt/Calculator-v0", 2, 1, first_seed=EVAL_SEED_END - 1)
    with pytest.raises(ValueError, match="k >= 1"):
        eval_episodes("srt/Calculator-v0", 2, 0)


def test_training_step_metrics_carry_tool_errors_garbled_turns_endings_and_kinds() -> None:
    trajectories = [
        traj(0, 0, success=T, kind="cancel"),
        traj(1, 0, success=F, status="truncated", reason="max_turns: 30 reached", kind="info"),
    ]
    m = rollout_metrics(trajectories, 1.0, SpecStats())
    assert m["tool_calls_mean"] == 2.0 and m["tool_error_rate"] == 0.5
    assert m["garbled_turn_rate"] == 0.25  # the unsolved episode's last turn
    assert m["ended_terminated"] == m["ended_max_turns"] == 0.5
    assert (m["success_cancel"], m["success_info"], m["turns_info"]) == (1.0, 0.0, 2.0)
    assert "progress_mean" not in m  # the env reports no progress
    reported = [
        dataclasses.replace(t, final_info={**t.final_info, "progress": p})
        for t, p in zip(trajectories, (1.0, 0.25), strict=True)
    ]
    assert rollout_metrics(reported, 1.0, SpecStats())["progress_mean"] == 0.625
