import asyncio
import threading
import time

import pytest

from srt_agent.tooling.definition import tool
from srt_agent.tooling.parser import format_tool_call, parse_tool_calls
from srt_agent.tooling.toolset import ToolSet, render_output

release = threading.Event()


@tool(timeout=0.3)
def hang(seconds: float) -> str:
    """Sleep (blocks its thread)."""
    release.wait(seconds)
    return "woke up"


@tool(timeout=0.3)
async def ahang(seconds: float) -> str:
    """Sleep asynchronously."""
    await asyncio.sleep(seconds)
    return "woke up"


@tool
def boom(message: str) -> str:
    """Raise."""
    raise RuntimeError(message)


@tool
def big(n: int) -> str:
    """Return n characters."""
    return "x" * n


@tool
async def double(x: int) -> int:
    """Double asynchronously."""
    return 2 * x


TOOLS = ToolSet([hang, ahang, boom, big, double], max_output_chars=100)


def run(text: str) -> list[tuple[str | None, str]]:
    return [(r.error, r.content) for r in TOOLS.execute(parse_tool_calls(text))]


def test_successful_sync_and_async_calls() -> None:
    out = run(format_tool_call("double", {"x": 21}) + format_tool_call("big", {"n": 3}))
    assert out == [(None, "42"), (None, "xxx")]


def test_each_failure_becomes_an_error_result_in_call_order() -> None:
    text = (
        format_tool_call("nope", {})
        + "<tool_call>{broken</tool_call>"
        + format_tool_call("double", {"x": "abc"})
        + format_tool_call("boom", {"message": "disk on fire"})
        + format_tool_call("double", {"x": 1})
    )
    out = run(text)
    assert [kind for kind, _ in out] == ["unknown_tool", "malformed_call", "invalid_arguments", "error", None]
    assert "available: hang, ahang, boom, big, double" in out[0][1]
    assert out[1][1].startswith("Error (malformed_call): invalid JSON")
    assert "argument 'x'" in out[2][1]
    assert out[3][1] == "Error (error): RuntimeError: disk on fire"
    assert out[4][1] == "2"


@pytest.mark.parametrize("name", ["hang", "ahang"])
def test_timeouts_sync_and_async(name: str) -> None:
    t0 = time.perf_counter()
    out = run(format_tool_call(name, {"seconds": 30}))
    assert out[0][0] == "timeout" and "did not finish within 0.3 s" in out[0][1]
    assert time.perf_counter() - t0 < 5


def test_output_is_truncated_with_a_note() -> None:
    [(kind, content)] = run(format_tool_call("big", {"n": 1000}))
    assert kind is None and content.startswith("x" * 100) and "truncated 900 characters" in content
    assert render_output({"a": [1, 2]}, 100) == '{"a": [1, 2]}'
    assert render_output(None, 100) == "(no output)"


def test_async_execution_does_not_block_the_loop_on_a_hung_sync_tool() -> None:
    async def main() -> tuple[list[str | None], float]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            for _ in range(10):
                await asyncio.sleep(0.02)
                ticks += 1

        parsed = parse_tool_calls(
            format_tool_call("hang", {"seconds": 30}) + format_tool_call("double", {"x": 2})
        )
        results, _ = await asyncio.gather(TOOLS.aexecute(parsed), ticker())
        return [r.error for r in results], ticks

    errors, ticks = asyncio.run(main())
    assert errors == ["timeout", None]
    assert ticks == 10  # the loop kept running while the tool hung


def test_duplicate_names_and_bad_limits_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate tool name"):
        ToolSet([big, big])
    with pytest.raises(ValueError, match="max_output_chars"):
        ToolSet([big], max_output_chars=1)


def test_schemas_are_fresh_copies() -> None:
    a, b = TOOLS.schemas(), TOOLS.schemas()
    a[0]["function"]["name"] = "changed"
    assert b[0]["function"]["name"] == "hang" and TOOLS.schemas()[0]["function"]["name"] == "hang"


@tool(timeout=0.3)
async def sleepy(seconds: float) -> str:
    """An async tool that blocks its event loop (time.sleep)."""
    time.sleep(seconds)
    return "slept"


@tool(timeout=0.3)
async def stubborn(seconds: float) -> str:
    """An async tool that swallows its cancellation."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            continue
    return "done"


@tool(timeout=0.3)
def spin(seconds: float) -> str:
    """Busy-loop in Python code."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    return "spun"


ROGUES = ToolSet([sleepy, stubborn, spin, double], max_calls_per_turn=4)


@pytest.mark.parametrize("name", ["sleepy", "stubborn"])
def test_async_tool_timeouts_hold_whatever_the_tool_does(name: str) -> None:
    async def main() -> tuple[str | None, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            for _ in range(10):
                await asyncio.sleep(0.02)
                ticks += 1

        parsed = parse_tool_calls(format_tool_call(name, {"seconds": 20}))
        results, _ = await asyncio.gather(ROGUES.aexecute(parsed), ticker())
        return results[0].error, ticks

    t0 = time.perf_counter()
    error, ticks = asyncio.run(main())
    assert error == "timeout" and ticks == 10  # the rollout's loop never stalled
    assert time.perf_counter() - t0 < 5  # not the tool's 20 s


def test_a_timed_out_tool_spinning_in_python_is_stopped() -> None:
    def spinning() -> int:
        return sum(t.name == "srt-tool" and t.is_alive() for t in threading.enumerate())

    before = spinning()
    [result] = ROGUES.execute(parse_tool_calls(format_tool_call("spin", {"seconds": 60})))
    assert result.error == "timeout"
    deadline = time.perf_counter() + 5
    while spinning() > before and time.perf_counter() < deadline:
        time.sleep(0.02)
    assert spinning() == before  # asked to stop at the timeout, it did (not 60 s later)


def test_calls_past_the_per_turn_cap_do_not_run() -> None:
    text = "".join(format_tool_call("double", {"x": i}) for i in range(6))
    out = [(r.error, r.content) for r in ROGUES.execute(parse_tool_calls(text))]
    assert [e for e, _ in out] == [None] * 4 + ["too_many_calls"] * 2
    assert "this turn made 6 tool calls and at most 4 run per turn" in out[4][1]


def test_deeply_nested_json_is_a_malformed_call_not_a_crash() -> None:
    body = '{"name": "double", "arguments": {"x": ' + "[" * 5000 + "]" * 5000 + "}}"
    [call] = parse_tool_calls(f"<tool_call>{body}</tool_call>").errors
    assert "nested too deeply" in call.reason
    nested = '{"name": "double", "arguments": "' + "[" * 5000 + "]" * 5000 + '"}'
    [call] = parse_tool_calls(f"<tool_call>{nested}</tool_call>").errors
    assert "not a JSON object" in call.reason
