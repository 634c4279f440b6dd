"""Failure isolation: env, template and engine failures mark only their own trajectory."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from chat_fixtures import TEMPLATES
from scripted_engine import Response, ScriptedEngine
from test_rollout_support import SCRIPT_ENV, episode_of, tiny_format

from srt_agent.contracts.generation import GenerationOutput, GenerationRequest, PromptTooLongError
from srt_agent.rollout import EpisodeRequest, Trajectory, run_rollouts

# Qwen2.5's template, except that it rewrites the start of the text when the newest message is
# exactly "REWRITE": append-only for every other conversation, so only that episode breaks.
REWRITING = (
    "{%- if messages[-1]['content'] == 'REWRITE' %}{{- 'rewritten ' }}{%- endif %}"
    + (TEMPLATES / "qwen2.5.jinja").read_text()
)


def respond(req: GenerationRequest) -> Response:
    ep = episode_of(req)
    if ep == "abort":
        return GenerationOutput(req.request_id, (), (), "abort", error="out of KV cache blocks")
    if ep == "raise":
        raise RuntimeError("engine worker died")
    if ep == "too-long":
        raise PromptTooLongError("prompt of 9999 tokens leaves no room in 4096")
    if ep == "flood" and req.request_id.endswith("#0"):
        return "one"
    return "DONE" if ep.startswith("ok") else "one"


CASES: dict[str, tuple[dict[str, Any], str, str]] = {
    "ok-1": ({}, "ok", ""),
    "step": ({"fail_in": "step"}, "failed", "env raised ValueError: boom in step"),
    "reset": ({"fail_in": "reset"}, "failed", "env raised ValueError: reset went wrong in reset"),
    "make": ({"no_such_option": 1}, "failed", "env raised EnvConfigError: ScriptEnv: unknown option"),
    "abort": ({}, "failed", "engine aborted: out of KV cache blocks"),
    "raise": ({}, "failed", "engine raised RuntimeError: engine worker died"),
    "too-long": ({}, "truncated", "context limit: prompt of 9999 tokens"),
    "template": ({"reply": "REWRITE"}, "failed", "chat template: TemplateContinuityError: turn 1"),
    "flood": ({"reply": "many words " * 3000}, "truncated", "context limit: 4096 tokens (prompt is"),
    "ok-2": ({}, "ok", ""),
}


@pytest.fixture(scope="module")
def outcome() -> tuple[dict[str, Trajectory], ScriptedEngine, list[logging.LogRecord]]:
    fmt = tiny_format(REWRITING)
    engine = ScriptedEngine(fmt, respond, max_context=4096)
    specs = [
        EpisodeRequest(SCRIPT_ENV, seed=i, episode_id=case, env_options=options)
        for i, (case, (options, _, _)) in enumerate(CASES.items())
    ]
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    log = logging.getLogger("srt_agent.rollout")
    log.addHandler(handler)
    try:
        trajectories = run_rollouts(engine, fmt, specs, max_concurrent=4)
    finally:
        log.removeHandler(handler)
    return {t.episode_id: t for t in trajectories}, engine, records


@pytest.mark.parametrize("case", list(CASES))
def test_each_failure_marks_only_its_own_trajectory(
    case: str, outcome: tuple[dict[str, Trajectory], ScriptedEngine, list[logging.LogRecord]]
) -> None:
    trajectories, _, _ = outcome
    _, status, reason = CASES[case]
    traj = trajectories[case]
    assert traj.status == status and traj.reason.startswith(reason), traj.reason
    assert traj.success == (status == "ok")
    assert traj.truncated == (status == "truncated")


def test_failed_episodes_keep_what_happened_before_the_failure(
    outcome: tuple[dict[str, Trajectory], ScriptedEngine, list[logging.LogRecord]],
) -> None:
    trajectories, engine, records = outcome
    # Reset failed: nothing was rendered; make failed: not even a task id.
    assert trajectories["reset"].token_ids == () and trajectories["reset"].num_turns == 0
    assert trajectories["make"].task_id == "" and trajectories["make"].messages == ()
    assert "\n" not in trajectories["make"].reason  # one line; the option list is in the log
    # The step that raised still has its generated turn (reward 0) in the tokens.
    step = trajectories["step"]
    assert step.num_turns == 1 and step.turn_rewards == (0.0,) and step.loss_mask[-1] == 1
    # The aborted request's (empty) output is not recorded as a turn.
    assert trajectories["abort"].num_turns == 0 and trajectories["abort"].prompt_len > 0
    # The template broke when the first observation was appended, after turn 0.
    assert trajectories["template"].num_turns == 1 and trajectories["template"].turn_rewards == (0.25,)
    # The flooded prompt was never sent: one request only, and it fitted the context.
    flood = [c.request for c in engine.calls if episode_of(c.request) == "flood"]
    assert len(flood) == 1 and trajectories["flood"].num_turns == 1
    assert trajectories["flood"].messages[-1].content.startswith("many words")
    # Every failure is logged with its episode id and the original exception; truncations are not warned.
    warned = {r.args[0] for r in records if r.levelno == logging.WARNING}  # type: ignore[index]
    assert warned == {k for k, (_, status, _) in CASES.items() if status == "failed"}
    step_record = next(r for r in records if r.args and r.args[0] == "step")  # type: ignore[index]
    assert step_record.exc_info is not None
    assert isinstance(step_record.exc_info[1], ValueError) and "boom" in str(step_record.exc_info[1])
