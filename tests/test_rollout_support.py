"""Shared fakes for the rollout and eval tests (this module holds no tests).

* ``ScriptEnv`` (``test-rollout/Script-v0``): a tool-using env whose failures, replies and
  rewards are set by options, with an async ``nap`` tool that records when it slept;
* ``tiny_format()``: the tiny ChatML tokenizer of ``chat_fixtures`` in a ChatFormat;
* ``turn_of`` / ``episode_of``: read a scheduler request id (``<episode_id>#<turn>``);
* ``chatml_history`` / ``oracle_responder``: let each env's oracle drive a ScriptedEngine by
  reading the conversation back from the prompt tokens;
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

from chat_fixtures import tiny_tokenizer
from pydantic import Field

from srt_agent.chat.messages import Message, system, tool_result, user
from srt_agent.chat.template import ChatFormat
from srt_agent.contracts.generation import GenerationRequest
from srt_agent.env.episode_loop import Policy
from srt_agent.env.multi_turn import EnvConfig, MultiTurnEnv, Transition, oracle_policy
from srt_agent.env.registration import make, register_env
from srt_agent.tooling.definition import tool
from srt_agent.tooling.parser import MalformedCall, ParsedTurn, ToolCall, parse_tool_calls
from srt_agent.tooling.toolset import ToolResult, ToolSet

NAPS: list[tuple[str, float, float]] = []
"""(label, start, end) of every ``nap`` call, in ``time.perf_counter`` seconds."""


@tool
async def nap(seconds: float, label: str = "") -> str:
    """Sleep without blocking the event loop (an I/O-bound tool).

    Args:
        seconds: How long to sleep.
        label: Who is napping (recorded for overlap checks).
    """
    start = time.perf_counter()
    await asyncio.sleep(seconds)
    NAPS.append((label, start, time.perf_counter()))
    return "rested"


class ScriptConfig(EnvConfig):
    fail_in: Literal["", "reset", "step"] = Field("", description="Raise ValueError here.")
    reply: str = Field("Go on.", description="The user's reply to a turn that is not DONE.")


class ScriptEnv(MultiTurnEnv):
    """Rewards: 0.5 per tool turn, 0.25 per plain turn, 1.0 (and the end) for a turn saying DONE."""

    config_model = ScriptConfig

    def __init__(self, render_mode: str | None = None, **options: Any):
        super().__init__(render_mode=render_mode, **options)
        self.config: ScriptConfig

    def build_tools(self) -> ToolSet:
        return ToolSet([nap])

    def new_task(self, options: dict[str, Any]) -> tuple[str, Sequence[Message]]:
        if self.config.fail_in == "reset":
            raise ValueError("reset went wrong")
        nonce = int(self.np_random.integers(1000))
        return f"script-{nonce}", [system("You are a test agent."), user(f"Count, then say DONE ({nonce}).")]

    def on_message(self, text: str) -> Transition:
        if self.config.fail_in == "step":
            raise ValueError("boom")
        if "DONE" in text:
            return Transition(messages=[user("Well done.")], reward=1.0, terminated=True, info={"n": 1})
        return Transition(messages=[user(self.config.reply)], reward=0.25)

    def on_tool_results(self, turn: ParsedTurn, results: list[ToolResult]) -> Transition:
        return Transition(messages=[r.to_message() for r in results], reward=0.5)


SCRIPT_ENV = "test-rollout/Script-v0"
register_env(SCRIPT_ENV, ScriptEnv)


@functools.cache
def tiny_format(template: str | None = None) -> ChatFormat:
    return ChatFormat(tiny_tokenizer(), chat_template=template)


def turn_of(req: GenerationRequest) -> int:
    return int(req.request_id.rsplit("#", 1)[1])


def episode_of(req: GenerationRequest) -> str:
    return req.request_id.rsplit("#", 1)[0]


# ---------------------------------------------------------------------- oracle-driven engine
_TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


def _tool_names(assistant_text: str) -> list[str]:
    turn = parse_tool_calls(assistant_text)
    calls: list[ToolCall | MalformedCall] = [*turn.calls, *turn.errors]
    calls.sort(key=lambda c: int(c.id.rsplit("_", 1)[-1]))  # results come back in call order
    return [c.name if isinstance(c, ToolCall) else "invalid" for c in calls]


def chatml_history(text: str) -> list[Message]:
    """The messages of a ChatML (Qwen2.5 template) prompt; tool results named after the calls."""
    history: list[Message] = []
    for block in text.split("<|im_start|>")[1:]:
        role, _, body = block.partition("\n")
        if "<|im_end|>" not in body:
            continue  # the open generation prompt
        content = body.split("<|im_end|>")[0]
        if role == "user" and content.startswith("<tool_response>"):
            previous = next(m for m in reversed(history) if m.role == "assistant")
            names = _tool_names(previous.content)
            for i, result in enumerate(_TOOL_RESPONSE.findall(content)):
                history.append(tool_result(result, call_id=f"c{i}", name=names[i]))
        else:
            history.append(Message(role=role, content=content))  # type: ignore[arg-type]
    return history


def oracles(env_id: str, seeds: range, **options: Any) -> dict[str, Policy]:
    """Each seed's oracle, by task id."""
    found: dict[str, Policy] = {}
    env = make(env_id, **options)
    for seed in seeds:
        _, info = env.reset(seed=seed)
        found[info["task_id"]] = oracle_policy(env)
    env.close()
    return found


def oracle_responder(fmt: ChatFormat, by_task: dict[str, Policy]) -> Callable[[GenerationRequest], str]:
    def respond(req: GenerationRequest) -> str:
        return by_task[req.task_id].act(chatml_history(fmt.decode(req.prompt_ids)))

    return respond
