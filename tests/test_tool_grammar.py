"""The tool-call grammar accepts exactly the canonical calls to an env's tools."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

from srt_agent.env.episode_loop import run_episode
from srt_agent.env.multi_turn import oracle_policy
from srt_agent.tooling.grammar import CallState, ToolCallGrammar
from srt_agent.tooling.parser import CLOSE_TAG, OPEN_TAG, format_tool_call, split_blocks

SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {
                    "n": {"type": "integer"},
                    "x": {"type": "number"},
                    "b": {"type": "boolean"},
                    "mode": {"enum": ["fast", "slow"]},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "extra": {"type": "object"},
                },
                "required": ["n"],
                "additionalProperties": False,
            },
        },
    },
    {"name": "g", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
    {"name": "free", "parameters": {"type": "object"}},  # no properties: any keys
]
GRAMMAR = ToolCallGrammar.from_schemas(SCHEMAS)


def accepts(body: str, grammar: ToolCallGrammar = GRAMMAR) -> bool:
    """The whole body is a call (the grammar's end state)."""
    state = grammar.feed(grammar.start(), body)
    return state is not None and state.ended


def prefix_ok(body: str) -> bool:
    return GRAMMAR.feed(GRAMMAR.start(), body) is not None


def body(name: str, arguments: dict[str, object]) -> str:
    return format_tool_call(name, arguments)[len(OPEN_TAG) : -len(CLOSE_TAG)]


@pytest.mark.parametrize(
    "arguments",
    [
        {"n": 3},
        {"n": -12, "x": 3.25, "b": True, "mode": "slow"},
        {"tags": ["a", "b c"], "n": 0},
        {"n": 1, "tags": [], "extra": {"k": [1, "v", None, {}], "t": False, "u": -0.5}},
    ],
)
def test_canonical_calls_are_accepted(arguments: dict[str, object]) -> None:
    assert accepts(body("f", arguments))


def test_tools_without_parameters_and_open_schemas() -> None:
    assert accepts(body("g", {}))
    assert not prefix_ok('{"name": "g", "arguments": {"')  # g has no parameters
    assert accepts(body("free", {"anything": [1, 2], "else": "x"}))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"name": "h"', "unknown tool"),
        ('{"name": "f", "arguments": {}}', "required parameter missing"),
        ('{"name": "f", "arguments": {"m"', "unknown parameter"),
        ('{"name": "f", "arguments": {"n": 1, "n"', "repeated parameter"),
        ('{"name": "f", "arguments": {"n": "1"', "string for an integer"),
        ('{"name": "f", "arguments": {"n": 01', "leading zero"),
        ('{"name": "f", "arguments": {"n": 1.5', "fraction in an integer"),
        ('{"name": "f", "arguments": {"n": 1, "x": 1.}', "number without fraction digits"),
        ('{"name": "f", "arguments": {"n": 1, "mode": "medium', "value outside the enum"),
        ('{"name": "f", "arguments": {"n": 1, "b": 1', "number for a boolean"),
        ('{"name": "f", "arguments": {"n": 1, "tags": [1', "number in a list of strings"),
        ('{"name": "f", "arguments": {"n": 1, "tags": ["a\\', "escape in a string"),
        ('{"name":"f"', "non-canonical spacing"),
        ('{"name": "f", "arguments": {"n": 1}} ', "text after the call"),
        ('{"arguments": {}, "name": "g"}', "arguments before the name"),
    ],
)
def test_invalid_text_is_refused(text: str, why: str) -> None:
    assert not prefix_ok(text), why


def test_prefixes_of_a_call_are_prefixes_and_only_the_whole_call_ends() -> None:
    text = body("f", {"n": 42, "tags": ["x"]})
    for i in range(len(text)):
        state = GRAMMAR.feed(GRAMMAR.start(), text[:i])
        assert state is not None and not state.ended, text[:i]
    assert accepts(text)


def test_states_are_shared_across_values() -> None:
    """Values of one kind reach the same state whatever they hold: masks are cached per state."""
    a = GRAMMAR.feed(GRAMMAR.start(), '{"name": "f", "arguments": {"n": 12, "tags": ["abc", "d')
    b = GRAMMAR.feed(GRAMMAR.start(), '{"name": "f", "arguments": {"n": 345, "tags": ["xy", "zzz')
    assert isinstance(a, CallState) and a == b and hash(a) == hash(b)


def test_no_tools_or_a_nameless_tool_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="at least one tool"):
        ToolCallGrammar.from_schemas([])
    with pytest.raises(ValueError, match="without a usable name"):
        ToolCallGrammar.from_schemas([{"type": "function", "function": {"parameters": {}}}])


def test_every_call_the_retail_oracle_writes_is_accepted() -> None:
    env = gym.make("srt/Retail-v0")
    _, info = env.reset(seed=0)
    grammar = ToolCallGrammar.from_schemas(info["tools"])
    calls = 0
    for seed in range(12):
        result = run_episode(env, oracle_policy, seed=seed)
        for message in result.transcript:
            if message.role != "assistant":
                continue
            for found in split_blocks(message.content)[1]:
                assert accepts(found, grammar), found
                json.loads(found)
                calls += 1
    assert calls > 40
