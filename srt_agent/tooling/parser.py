"""Parsing Hermes/Qwen-style tool calls out of assistant text.

The convention (Hermes, Qwen2.5, Qwen3 chat templates)::

    Some text. <tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>

Several calls per turn are allowed. Models get this wrong in every possible way, so the parser never
raises: each ``<tool_call>`` block becomes either a :class:`ToolCall` or a :class:`MalformedCall`
with a reason the model can read and act on.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
CALL_FORMAT_HINT = f'{OPEN_TAG}{{"name": "<tool name>", "arguments": {{...}}}}{CLOSE_TAG}'

_FENCE_RE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


class ToolCall(BaseModel):
    """One well-formed tool call.

    Attributes:
        id: Position-based id within the turn (``call_0``, ``call_1``, ...); envs may prefix it.
        name: The tool name as written by the model (it may name no existing tool).
        arguments: The decoded arguments object.
    """

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: dict[str, Any]


class MalformedCall(BaseModel):
    """A ``<tool_call>`` block that could not be decoded.

    Attributes:
        id: Position-based id within the turn.
        raw: The text inside the block (truncated to 200 characters).
        reason: Why it was rejected, phrased for the model.
    """

    model_config = ConfigDict(frozen=True)

    id: str
    raw: str
    reason: str


class ParsedTurn(BaseModel):
    """What an assistant turn contained.

    Attributes:
        text: The turn with all tool-call blocks removed, stripped.
        calls: Decoded calls, in order. ``calls`` and ``errors`` share one id sequence.
        errors: Blocks that could not be decoded, in order.
    """

    model_config = ConfigDict(frozen=True)

    text: str
    calls: tuple[ToolCall, ...] = ()
    errors: tuple[MalformedCall, ...] = ()

    @property
    def has_calls(self) -> bool:
        """True when the turn tried to call at least one tool (well-formed or not)."""
        return bool(self.calls or self.errors)


def split_blocks(text: str) -> tuple[str, list[str]]:
    """Split an assistant turn into the text outside its tool-call blocks and the blocks' raw bodies.

    The bodies are not decoded (:func:`parse_tool_calls` does that); callers that feed them to a
    grammar or a matcher use this so that every reader agrees with the parser on where a block
    starts and ends.
    """
    outside: list[str] = []
    bodies: list[str] = []
    pos = 0
    while True:
        start = text.find(OPEN_TAG, pos)
        if start < 0:
            outside.append(text[pos:])
            break
        outside.append(text[pos:start])
        body_start = start + len(OPEN_TAG)
        # A block ends at its close tag; a missing close tag (common when generation stops on
        # the tag itself) ends it at the next open tag or the end of the text.
        end = text.find(CLOSE_TAG, body_start)
        next_open = text.find(OPEN_TAG, body_start)
        if end >= 0 and (next_open < 0 or end < next_open):
            bodies.append(text[body_start:end])
            pos = end + len(CLOSE_TAG)
        else:
            stop = next_open if next_open >= 0 else len(text)
            bodies.append(text[body_start:stop])
            pos = stop
    return "".join(outside).replace(CLOSE_TAG, ""), bodies


def _decode(body: str) -> tuple[str, dict[str, Any]] | str:
    """Decode one block body into ``(name, arguments)``, or return the reason it is malformed."""
    src = body.strip()
    fenced = _FENCE_RE.match(src)
    if fenced:
        src = fenced.group(1)
    if not src:
        return f"empty tool call; expected {CALL_FORMAT_HINT}"
    try:
        obj, end = json.JSONDecoder().raw_decode(src)
    except json.JSONDecodeError as exc:
        return f"invalid JSON ({exc.msg} at character {exc.pos}); expected {CALL_FORMAT_HINT}"
    except RecursionError:  # a few KB of nested brackets exhaust the decoder's recursion
        return f"the JSON is nested too deeply to decode; expected {CALL_FORMAT_HINT}"
    if src[end:].strip():
        return f"unexpected text after the JSON object: {src[end:].strip()[:40]!r}"
    if not isinstance(obj, dict):
        return f"the call must be a JSON object, got {type(obj).__name__}; expected {CALL_FORMAT_HINT}"
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return f'missing or non-string "name"; expected {CALL_FORMAT_HINT}'
    args: Any = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        # Some models JSON-encode the arguments a second time (OpenAI's wire format does).
        try:
            args = json.loads(args) if args.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return f'"arguments" is a string that is not a JSON object: {args[:40]!r}'
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return f'"arguments" must be a JSON object, got {type(args).__name__}'
    return name.strip(), args


def parse_tool_calls(text: str, *, id_prefix: str = "") -> ParsedTurn:
    """Extract every tool call from an assistant turn.

    Args:
        text: The assistant's full text for the turn.
        id_prefix: Prepended to the position-based call ids (envs use the turn number so ids are
            unique within an episode).

    Returns:
        The decoded calls, the malformed blocks with reasons, and the remaining text. Never raises.
    """
    outside, bodies = split_blocks(text)
    calls: list[ToolCall] = []
    errors: list[MalformedCall] = []
    for i, body in enumerate(bodies):
        decoded = _decode(body)
        if isinstance(decoded, str):
            errors.append(MalformedCall(id=f"{id_prefix}call_{i}", raw=body.strip()[:200], reason=decoded))
        else:
            calls.append(ToolCall(id=f"{id_prefix}call_{i}", name=decoded[0], arguments=decoded[1]))
    return ParsedTurn(text=outside.strip(), calls=tuple(calls), errors=tuple(errors))


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """Write a call in the format :func:`parse_tool_calls` reads (used by oracles and tests)."""
    return f"{OPEN_TAG}{json.dumps({'name': name, 'arguments': arguments})}{CLOSE_TAG}"


TurnForm = Literal["tool_call", "text", "garbled"]
"""What an assistant turn is: well-formed tool call(s), plain text, or neither."""

# Pieces of markup that plain text never contains: a tool-call tag outside a block (an unmatched
# or half-written one), or a chat-template special token the model wrote as text.
_MARKUP_RE = re.compile(r"</?tool_call|tool_call>|<\|")


def turn_form(text: str) -> TurnForm:
    """Whether ``text`` (an assistant turn) is well-formed tool calls, plain text, or garbled.

    Garbled: a call block that does not decode, tool-call tags or chat-template tokens left in
    the text outside the blocks, undecodable bytes (U+FFFD), or an empty turn. Text beside
    well-formed calls is allowed (Hermes and Qwen templates allow it).
    """
    parsed = parse_tool_calls(text)
    stray_close = text.count(CLOSE_TAG) > text.count(OPEN_TAG)  # the parser drops unmatched closing tags
    if parsed.errors or stray_close or "\ufffd" in text or _MARKUP_RE.search(parsed.text):
        return "garbled"
    if parsed.calls:
        return "tool_call"
    return "text" if parsed.text else "garbled"
