import asyncio
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import pytest

from srt_agent import Message, MultiTurnEnv, Transition, async_step, run_episode
from srt_agent.chat.messages import user
from srt_agent.env.multi_turn import EnvConfigError
from srt_agent.env.spaces import AnyText, MessagesSpace
from srt_agent.env.testing import GenericTestEnv, ScriptedPolicy, check_multiturn_env
from srt_agent.tooling.definition import tool
from srt_agent.tooling.parser import format_tool_call

gym.register("test/Generic-v0", entry_point="srt_agent.env.testing:GenericTestEnv")


def test_generic_env_passes_gymnasium_and_contract_checks() -> None:
    check_multiturn_env(GenericTestEnv())
    check_multiturn_env(gym.make("test/Generic-v0", render_mode="ansi"))


def test_spaces_accept_any_text_and_only_message_tuples() -> None:
    space = AnyText(max_length=50)
    assert "Hello, world! <tool_call>{...}</tool_call>\n→ 数" in space
    assert "x" * 51 not in space and 3 not in space
    space.seed(0)
    assert all(space.sample() in space for _ in range(50))
    msgs = MessagesSpace(max_messages=2)
    assert (user("hi"),) in msgs and () in msgs
    assert [user("hi")] not in msgs and ("hi",) not in msgs and (user("a"),) * 3 not in msgs
    msgs.seed(0)
    assert all(msgs.sample() in msgs for _ in range(20))


def test_episode_with_tool_call_then_answer() -> None:
    env = GenericTestEnv(answer="42", render_mode="ansi")
    policy = ScriptedPolicy([format_tool_call("echo", {"text": "ping"}), "It is 42."])
    result = run_episode(env, policy, seed=1)
    assert result.total_reward == 1.0 and result.terminated and not result.truncated and result.turns == 2
    roles = [m.role for m in result.transcript]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    tool_msg = result.transcript[3]
    assert tool_msg.content == "ping" and tool_msg.name == "echo" and tool_msg.tool_call_id == "t1_call_0"
    assert env.transcript == result.transcript
    rendered = env.render()
    assert rendered is not None and "[tool (echo)]\nping" in rendered


def test_truncation_at_max_turns_and_step_after_end() -> None:
    env = GenericTestEnv(max_turns=3)
    result = run_episode(env, ScriptedPolicy(["no idea"]), seed=0)
    assert result.truncated and not result.terminated and result.turns == 3 and result.total_reward == 0
    assert result.final_info["truncation_reason"] == "max_turns=3 reached"
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("again")


def test_step_before_reset_and_non_text_action_are_rejected() -> None:
    env = GenericTestEnv()
    with pytest.raises(RuntimeError, match="reset"):
        env.step("hi")
    env.reset(seed=0)
    with pytest.raises(TypeError, match="str"):
        env.step(42)  # type: ignore[arg-type]


def test_bad_options_name_the_valid_ones() -> None:
    with pytest.raises(EnvConfigError) as info:
        GenericTestEnv(max_turns=0, colour="red")
    msg = str(info.value)
    assert "unknown option 'colour'" in msg and "'max_turns'=0" in msg and "answer: str" in msg
    with pytest.raises(EnvConfigError, match="render_mode='human'"):
        GenericTestEnv(render_mode="human")


def test_same_seed_same_task_and_info_fields() -> None:
    env = GenericTestEnv()
    _, a = env.reset(seed=5)
    _, b = env.reset(seed=5)
    _, c = env.reset(seed=6)
    assert a["task_id"] == b["task_id"] != c["task_id"]
    assert a["tools"][0]["function"]["name"] == "echo" and a["max_turns"] == 16


def test_astep_runs_tools_on_the_event_loop_and_overlaps_episodes() -> None:
    @tool(timeout=5)
    async def wait(seconds: float) -> str:
        """Wait."""
        await asyncio.sleep(seconds)
        return "done"

    async def one(seed: int) -> tuple[Message, ...]:
        env = gym.make("test/Generic-v0")
        env.unwrapped._extra_tools = [wait]  # type: ignore[attr-defined]
        env.unwrapped.tools = env.unwrapped.build_tools()  # type: ignore[attr-defined]
        env.reset(seed=seed)
        obs, *_ = await async_step(env, format_tool_call("wait", {"seconds": 0.3}))
        return obs

    async def main() -> tuple[list[tuple[Message, ...]], float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        out = await asyncio.gather(*(one(s) for s in range(8)))
        return list(out), loop.time() - t0

    results, elapsed = asyncio.run(main())
    assert all(obs[0].content == "done" for obs in results)
    assert elapsed < 8 * 0.3 / 2  # eight 0.3 s waits overlapped


class StepOnlyEnv(MultiTurnEnv):
    """An env that overrides step directly (no hooks): astep must still call it."""

    def new_task(self, options: dict[str, Any]) -> tuple[str, Sequence[Message]]:
        return "step-only", [user("hi")]

    def on_message(self, text: str) -> Transition:
        raise AssertionError("not used")

    def step(self, action: str) -> tuple[tuple[Message, ...], float, bool, bool, dict[str, Any]]:
        return (user(f"you said {action}"),), 0.5, True, False, {}


def test_astep_respects_an_overridden_step() -> None:
    env = StepOnlyEnv()
    env.reset(seed=0)
    obs, reward, terminated, _, _ = asyncio.run(env.astep("x"))
    assert obs[0].content == "you said x" and reward == 0.5 and terminated


def test_oracle_missing_is_a_clear_error() -> None:
    env = StepOnlyEnv()
    env.reset(seed=0)
    with pytest.raises(NotImplementedError, match="StepOnlyEnv does not provide an oracle"):
        env.oracle()
