import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srt_agent.tooling.parser import CLOSE_TAG, OPEN_TAG, format_tool_call, parse_tool_calls, turn_form

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)
json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
arguments = st.dictionaries(st.text(max_size=10), json_values, max_size=4)
plain_text = st.text(max_size=40).filter(lambda s: "<tool_call>" not in s and "</tool_call>" not in s)


@given(st.lists(st.tuples(plain_text, names, arguments), max_size=4), plain_text)
@settings(max_examples=200, deadline=None)
def test_round_trip_of_well_formed_calls(parts: list[tuple[str, str, dict[str, Any]]], tail: str) -> None:
    text = "".join(prefix + format_tool_call(name, args) for prefix, name, args in parts) + tail
    parsed = parse_tool_calls(text)
    assert parsed.errors == ()
    assert [(c.name, c.arguments) for c in parsed.calls] == [(n, a) for _, n, a in parts]
    assert [c.id for c in parsed.calls] == [f"call_{i}" for i in range(len(parts))]
    assert parsed.text == ("".join(p for p, _, _ in parts) + tail).strip()


@given(
    st.text(max_size=300)
    | st.lists(st.sampled_from([OPEN_TAG, CLOSE_TAG, "{", "}", '"name"', ":", "x"])).map("".join)
)
@settings(max_examples=300, deadline=None)
def test_never_raises_and_accounts_for_every_block(text: str) -> None:
    parsed = parse_tool_calls(text)
    assert len(parsed.calls) + len(parsed.errors) == text.count(OPEN_TAG)
    ids = [c.id for c in parsed.calls] + [e.id for e in parsed.errors]
    assert sorted(ids, key=lambda i: int(i.split("_")[1])) == [f"call_{i}" for i in range(len(ids))]
    assert OPEN_TAG not in parsed.text


def test_several_calls_with_surrounding_text() -> None:
    text = (
        "Let me compute. "
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'
        " and "
        '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call> done'
    )
    parsed = parse_tool_calls(text, id_prefix="t3_")
    assert [(c.id, c.name) for c in parsed.calls] == [("t3_call_0", "calculator"), ("t3_call_1", "search")]
    assert parsed.text == "Let me compute.  and  done"


def test_bad_json_is_reported_not_raised() -> None:
    parsed = parse_tool_calls('<tool_call>{"name": "calc", "arguments": {"expression": 1+1}}</tool_call>')
    assert parsed.calls == ()
    assert len(parsed.errors) == 1 and "invalid JSON" in parsed.errors[0].reason
    assert OPEN_TAG in parsed.errors[0].reason  # tells the model the expected format


def test_missing_close_tag_ends_at_text_end() -> None:
    parsed = parse_tool_calls('<tool_call>{"name": "a", "arguments": {}}')
    assert [c.name for c in parsed.calls] == ["a"]


def test_missing_close_tag_before_next_call() -> None:
    parsed = parse_tool_calls('<tool_call>{"name": "a"} <tool_call>{"name": "b"}</tool_call>')
    assert [c.name for c in parsed.calls] == ["a", "b"]


def test_variants_models_produce() -> None:
    fenced = parse_tool_calls('<tool_call>```json\n{"name": "a", "arguments": {"x": 1}}\n```</tool_call>')
    assert fenced.calls[0].arguments == {"x": 1}
    string_args = parse_tool_calls(
        "<tool_call>" + json.dumps({"name": "a", "arguments": json.dumps({"x": 2})}) + "</tool_call>"
    )
    assert string_args.calls[0].arguments == {"x": 2}
    params = parse_tool_calls('<tool_call>{"name": "a", "parameters": {"x": 3}}</tool_call>')
    assert params.calls[0].arguments == {"x": 3}
    no_args = parse_tool_calls('<tool_call>{"name": "a"}</tool_call>')
    assert no_args.calls[0].arguments == {}


def test_each_malformed_shape_has_a_reason() -> None:
    cases = {
        "<tool_call></tool_call>": "empty",
        "<tool_call>[1, 2]</tool_call>": "JSON object",
        '<tool_call>{"arguments": {}}</tool_call>': '"name"',
        '<tool_call>{"name": 3}</tool_call>': '"name"',
        '<tool_call>{"name": "a", "arguments": [1]}</tool_call>': "must be a JSON object",
        '<tool_call>{"name": "a", "arguments": "nope"}</tool_call>': "not a JSON object",
        '<tool_call>{"name": "a"} trailing</tool_call>': "unexpected text",
    }
    for text, fragment in cases.items():
        parsed = parse_tool_calls(text)
        assert parsed.calls == (), text
        assert fragment in parsed.errors[0].reason, (text, parsed.errors[0].reason)


def test_stray_close_tag_is_dropped_from_text() -> None:
    parsed = parse_tool_calls("hello </tool_call> world")
    assert parsed.calls == () and parsed.errors == ()
    assert parsed.text == "hello  world"
    assert not parsed.has_calls


@pytest.mark.parametrize(
    ("text", "form"),
    [
        ('<tool_call>{"name": "find_user", "arguments": {"email": "a@b.c"}}</tool_call>', "tool_call"),
        ('Let me look.\n<tool_call>{"name": "f", "arguments": {}}</tool_call>', "tool_call"),
        ('<tool_call>{"name": "f", "arguments": {}}', "tool_call"),  # generation stopped on the tag
        ("Your order was cancelled.", "text"),
        ('<tool_call>{"name": "f", "arguments": {"x": </tool_call>', "garbled"),  # does not decode
        ('</tool_call> {"name": "f"}', "garbled"),  # a stray closing tag
        ("Sure <tool_call", "garbled"),  # half a tag
        ("Done.<|im_end|> more", "garbled"),  # a template token written as text
        ("caf\ufffd", "garbled"),  # undecodable bytes
        ("   ", "garbled"),  # an empty turn
    ],
)
def test_turn_form_tells_calls_text_and_garbled_turns_apart(text: str, form: str) -> None:
    assert turn_form(text) == form
