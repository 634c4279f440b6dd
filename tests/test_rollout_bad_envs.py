"""An env that breaks its contract, or a tool that raises what it should not, fails only its episode.

One rollout batch mixes healthy episodes with an env whose ``step`` returns a bad reward, a bad
observation or bad info, or raises ``SystemExit`` / ``KeyboardInterrupt``, and with tools that
raise those or return a value that cannot be printed: the healthy episodes' results all come back,
each bad episode says why in its trajectory and in the trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, SupportsFloat

import gymnasium as gym
import pytest
from pydantic import Field
from scripted_engine import ScriptedEngine
from test_rollout_support import episode_of, tiny_format

from srt_agent.chat.messages import Message, system, user
from srt_agent.contracts.generation import GenerationRequest
from srt_agent.env.multi_turn import EnvConfig, MultiTurnEnv, Transition
from srt_agent.env.registration import register_env
from srt_agent.env.spaces import AnyText, MessagesSpace
from srt_agent.rollout import EpisodeRequest, Trajectory, run_rollouts
from srt_agent.rollout.trace import read_trace, write_trace
from srt_agent.tooling.definition import tool
from srt_agent.tooling.parser import format_tool_call
from srt_agent.tooling.toolset import ToolSet

Fault = Literal[
    "", "reward-none", "reward-text", "reward-nan", "obs-text", "obs-none", "obs-items", "info-list",
    "exit", "interrupt", "tuple3",
]  # fmt: skip


class PlainEnv(gym.Env[Any, str]):
    """A plain gymnasium env (not a MultiTurnEnv): its step returns whatever ``fault`` says."""

    def __init__(self, fault: Fault = "") -> None:
        self.fault = fault
        self.observation_space = MessagesSpace()
        self.action_space = AnyText()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        return (system("Test."), user("Say DONE.")), {"task_id": "plain"}

    def step(self, action: str) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        good: tuple[Any, ...] = ((user("ok"),), 1.0, True, False, {})
        bad: dict[str, Any] = {
            "": good,
            "reward-none": ((user("ok"),), None, True, False, {}),
            "reward-text": ((user("ok"),), "high", True, False, {}),
            "reward-nan": ((user("ok"),), float("nan"), True, False, {}),
            "obs-text": ("ok", 1.0, True, False, {}),
            "obs-none": (None, 1.0, True, False, {}),
            "obs-items": (("ok",), 1.0, True, False, {}),
            "info-list": ((user("ok"),), 1.0, True, False, ["tool_calls"]),
            "tuple3": ((user("ok"),), 1.0, True),
        }
        if self.fault == "exit":
            raise SystemExit(3)
        if self.fault == "interrupt":
            raise KeyboardInterrupt
        return bad[self.fault]  # type: ignore[no-any-return]


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text for you")

    __repr__ = __str__


@tool
def leave(how: str) -> Any:
    """A tool that misbehaves as asked.

    Args:
        how: "exit", "interrupt" or "unprintable".
    """
    if how == "exit":
        raise SystemExit(1)
    if how == "interrupt":
        raise KeyboardInterrupt
    return Unprintable()


class ToolConfig(EnvConfig):
    how: str = Field("exit", description="What the tool does.")


class ToolEnv(MultiTurnEnv):
    """One tool turn, then DONE ends the episode with reward 1."""

    config_model = ToolConfig

    def build_tools(self) -> ToolSet:
        return ToolSet([leave])

    def new_task(self, options: dict[str, Any]) -> tuple[str, Sequence[Message]]:
        return "tool-task", [system("Test."), user("Call leave, then say DONE.")]

    def on_message(self, text: str) -> Transition:
        return Transition(messages=[user("bye")], reward=1.0, terminated="DONE" in text)


if "test-bad/Plain-v0" not in gym.registry:  # gymnasium's checker off: these are our own checks
    gym.register(id="test-bad/Plain-v0", entry_point=PlainEnv, disable_env_checker=True)
register_env("test-bad/Tool-v0", ToolEnv)

PLAIN_CASES: dict[str, str] = {
    "reward-none": "step returned reward None (NoneType); expected a real number",
    "reward-text": "step returned reward 'high' (str); expected a real number",
    "reward-nan": "step returned reward nan; expected a finite number",
    "obs-text": "step returned observation 'ok' (str); expected a tuple of Message",
    "obs-none": "step returned observation None (NoneType); expected a tuple of Message",
    "obs-items": "step returned an observation whose item 0 is 'ok' (str)",
    "info-list": "step returned info ['tool_calls'] (list); expected a dict",
    "exit": "env raised SystemExit: 3 in step",
    "interrupt": "env raised KeyboardInterrupt in step",
    "tuple3": "step returned (",
}


def respond(req: GenerationRequest) -> str:
    ep = episode_of(req)
    if ep.startswith("tool-") and req.request_id.endswith("#0"):
        return format_tool_call("leave", {"how": ep.removeprefix("tool-")})
    return "DONE"


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Trajectory], Path]:
    fmt = tiny_format()
    specs = [EpisodeRequest("test-bad/Plain-v0", seed=0, episode_id="healthy-0")]
    specs += [
        EpisodeRequest("test-bad/Plain-v0", seed=i, episode_id=case, env_options={"fault": case})
        for i, case in enumerate(PLAIN_CASES, 1)
    ]
    specs += [
        EpisodeRequest("test-bad/Tool-v0", seed=0, episode_id=f"tool-{how}", env_options={"how": how})
        for how in ("exit", "interrupt", "unprintable")
    ]
    specs.append(EpisodeRequest("test-bad/Plain-v0", seed=99, episode_id="healthy-1"))
    trajectories = run_rollouts(ScriptedEngine(fmt, respond), fmt, specs, max_concurrent=4)
    trace = tmp_path_factory.mktemp("trace") / "bad.jsonl"
    write_trace(trace, trajectories)
    return {t.episode_id: t for t in trajectories}, trace


def test_healthy_episodes_of_the_batch_all_come_back(outcome: tuple[dict[str, Trajectory], Path]) -> None:
    trajectories, _ = outcome
    assert len(trajectories) == len(PLAIN_CASES) + 5
    for ep in ("healthy-0", "healthy-1"):
        assert trajectories[ep].status == "ok" and trajectories[ep].success


@pytest.mark.parametrize("case", list(PLAIN_CASES))
def test_a_broken_step_fails_its_episode_with_the_reason(
    case: str, outcome: tuple[dict[str, Trajectory], Path]
) -> None:
    traj = outcome[0][case]
    assert traj.status == "failed" and not traj.success
    assert PLAIN_CASES[case] in traj.reason, traj.reason
    assert traj.num_turns == 1  # the turn generated before the failure is kept


@pytest.mark.parametrize("how", ["exit", "interrupt", "unprintable"])
def test_a_tool_that_exits_or_cannot_be_printed_is_an_error_message_not_a_failure(
    how: str, outcome: tuple[dict[str, Trajectory], Path]
) -> None:
    traj = outcome[0][f"tool-{how}"]
    assert traj.status == "ok" and traj.success and traj.tool_errors == 1
    tool_message = next(m for m in traj.messages if m.role == "tool")
    expected = {
        "exit": "Error (error): SystemExit: 1",
        "interrupt": "Error (error): KeyboardInterrupt",
        "unprintable": "Error (error): the tool returned a Unprintable that could not be shown as text",
    }[how]
    assert tool_message.content.startswith(expected), tool_message.content


def test_the_trace_records_why_each_episode_failed(outcome: tuple[dict[str, Trajectory], Path]) -> None:
    trajectories, trace = outcome
    turns = read_trace(trace)
    by_episode = {t.episode_id: t for t in turns}
    for case in PLAIN_CASES:
        line = by_episode[case]
        assert line.episode_status == "failed" and line.episode_reason == trajectories[case].reason
    assert by_episode["healthy-0"].episode_reason == ""
