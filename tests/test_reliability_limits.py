"""Bounds on what user code can cost a rollout: time (env calls, tools in native code), and the size
of every message and error echoed back to the model."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import Field
from scripted_engine import ScriptedEngine
from test_rollout_support import tiny_format

from srt_agent.chat.messages import Message, system, user
from srt_agent.contracts.generation import GenerationRequest
from srt_agent.env.multi_turn import EnvConfig, MultiTurnEnv, Transition
from srt_agent.env.registration import register_env
from srt_agent.isolation import shutdown_workers
from srt_agent.rollout import EpisodeRequest, RolloutConfig, run_rollouts
from srt_agent.tooling.definition import tool
from srt_agent.tooling.parser import ToolCall
from srt_agent.tooling.toolset import ToolSet, render_output


class SlowConfig(EnvConfig):
    hang: str = Field("", description="'' (healthy), 'reset-sleep', 'step-spin' or 'huge-obs'.")


class SlowEnv(MultiTurnEnv):
    """One turn; hangs or floods as its ``hang`` option says."""

    config_model = SlowConfig

    def new_task(self, options: dict[str, Any]) -> tuple[str, Sequence[Message]]:
        if self.config.hang == "reset-sleep":
            time.sleep(3)  # one C call: the episode fails at the deadline, the thread ends later
        return "slow", [system("Test."), user("x" * 100_000 if self.config.hang == "huge-obs" else "Hi.")]

    def on_message(self, text: str) -> Transition:
        while self.config.hang == "step-spin":  # Python code: asked to stop at the deadline
            pass
        return Transition(messages=[user("bye")], reward=1.0, terminated=True)


register_env("test-slow/Slow-v0", SlowEnv)


def _respond(req: GenerationRequest) -> str:
    return "DONE"


def test_an_env_that_hangs_fails_its_episode_while_the_batch_goes_on() -> None:
    fmt = tiny_format()
    specs = [
        EpisodeRequest(
            "test-slow/Slow-v0", seed=i, episode_id=f"{hang or 'ok'}-{i}", env_options={"hang": hang}
        )
        for i, hang in enumerate(["", "reset-sleep", "step-spin", "", "huge-obs"])
    ]
    config = RolloutConfig(
        max_concurrent=8, env_step_timeout_s=0.5, env_setup_timeout_s=0.5, max_observation_chars=1000
    )
    t0 = time.perf_counter()
    by_id = {t.episode_id: t for t in run_rollouts(ScriptedEngine(fmt, _respond), fmt, specs, config=config)}
    assert time.perf_counter() - t0 < 2.5  # not the 3 s sleep, not forever
    assert by_id["ok-0"].status == by_id["ok-3"].status == "ok"
    assert by_id["reset-sleep-1"].status == "failed"
    assert (
        "env reset did not return within 0.5 s (rollout.env_setup_timeout_s)" in by_id["reset-sleep-1"].reason
    )
    assert by_id["step-spin-2"].status == "failed"
    assert "env step did not return within 0.5 s" in by_id["step-spin-2"].reason
    opening = by_id["huge-obs-4"].messages[1].content
    assert (
        by_id["huge-obs-4"].status == "ok" and len(opening) < 1100 and "truncated 99000 characters" in opening
    )
    deadline = time.monotonic() + 5  # the spinning thread was stopped; the sleeping one ends by itself
    while any(t.name.startswith("srt-env") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "an env thread was left behind"
        time.sleep(0.05)


@tool
def echo(text: str) -> str:
    """Echo.

    Args:
        text: Text.
    """
    return text


def test_every_error_a_tool_call_gets_back_is_capped() -> None:
    tools = ToolSet([echo], max_output_chars=500)
    huge = "y" * 1_000_000
    unknown = tools.call(ToolCall(id="1", name="n" * 31_000, arguments={}))
    bad_type = tools.call(ToolCall(id="2", name="echo", arguments={"text": [huge]}))
    extra = tools.call(ToolCall(id="3", name="echo", arguments={"text": "a", "k" * 50_000: 1}))
    for result in (unknown, bad_type, extra):
        assert result.error is not None and len(result.content) < 600, len(result.content)
        assert len(result.name) <= 64


def test_a_huge_result_is_rendered_without_encoding_all_of_it() -> None:
    import tracemalloc

    value = list(range(10_000_000))
    tracemalloc.start()
    text = render_output(value, 4000)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(text) < 4100 and "truncated" in text
    assert peak < 1_000_000  # the whole JSON would be ~79 MB: only the first chunks were encoded


def test_a_process_tool_stuck_in_one_c_call_is_killed_at_its_timeout() -> None:
    from process_tools import chatty, die, pid, stuck_in_c

    tools = ToolSet([stuck_in_c, chatty, die, pid])
    assert tools.call(ToolCall(id="0", name="chatty", arguments={"a": 1})).content == "2"  # warm, and prints
    t0 = time.perf_counter()
    stuck = tools.call(ToolCall(id="1", name="stuck_in_c", arguments={"digits": 10**9}))
    assert stuck.error == "timeout" and time.perf_counter() - t0 < 3.0  # in a thread: minutes
    died = tools.call(ToolCall(id="2", name="die", arguments={"code": 7}))
    assert died.error == "error" and "exit code 7" in died.content
    first = tools.call(ToolCall(id="3", name="pid", arguments={})).content
    assert tools.call(ToolCall(id="4", name="pid", arguments={})).content == first  # a worker is reused
    shutdown_workers()
    alive = subprocess.run(["ps", "-o", "pid=", "--ppid", str(os.getpid())], capture_output=True, text=True)
    assert first not in alive.stdout.split()


def test_a_process_tool_must_be_importable_by_name() -> None:
    def local(a: int) -> int:
        """Local.

        Args:
            a: Number.
        """
        return a

    with pytest.raises(ValueError, match="define it at the top level of an importable module"):
        tool(isolation="process")(local)
