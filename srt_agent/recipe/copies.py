"""Which tokens of a demonstration's tool calls are copied from the conversation.

A tool-using agent's hardest tokens are the values it copies into a call: a last name, a user id,
an order id, an item id, each read once earlier in the conversation (in the customer's message or
a tool's output) and worth the whole episode if one character is wrong. They are a few percent of
a demonstration's tokens, so with a plain loss a small model learns the call's shape long before
it learns to copy, and fills the value from a prior over the values it saw in training instead
(measured on Retail: a last name written from the names of other customers, the first name and
zip code beside it right). :func:`copy_mask` marks those tokens so that a build can weigh them up
(``BuildConfig.copy_weight``), as it weighs up digits.

A value counts as copied when it is a string argument of a tool call (at any depth: lists, nested
objects) and appears verbatim in an earlier message of the conversation (system prompt, customer,
tool outputs). Arguments the model composes (a reason chosen from a fixed list it was told, a
number it computed) are copies too if they appear earlier; anything not seen before is not.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from srt_agent.chat.messages import Message
from srt_agent.chat.template import ChatFormat, TokenTranscript
from srt_agent.recipe.demos import Demo
from srt_agent.tooling.parser import parse_tool_calls

MIN_COPY_CHARS = 2
"""Shorter string values (a one-letter size, an empty string) are not counted as copies."""


def _strings(value: Any) -> Iterator[str]:
    """Every string inside a decoded JSON value (lists and objects walked)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def copied_spans(action: str, seen: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of ``action``'s copied tool-call values.

    Args:
        action: An assistant turn's text (tool calls as the chat format writes them).
        seen: The conversation's text before the turn.

    Returns:
        The span of each string argument value found in ``seen`` (every place it is written in
        ``action``, without its quotes), sorted.
    """
    spans: set[tuple[int, int]] = set()
    for call in parse_tool_calls(action).calls:
        for value in _strings(call.arguments):
            if len(value) < MIN_COPY_CHARS or value not in seen:
                continue
            written = json.dumps(value, ensure_ascii=False)  # how it appears in the call's JSON
            start = action.find(written)
            while start >= 0:
                spans.add((start + 1, start + len(written) - 1))
                start = action.find(written, start + 1)
    return sorted(spans)


def _text(messages: Sequence[Message]) -> str:
    return "\n".join(m.content for m in messages)


def copy_mask(fmt: ChatFormat, demo: Demo, tr: TokenTranscript) -> tuple[int, ...]:
    """Per token of ``tr``, 1 where it is (part of) a copied tool-call value, else 0.

    Args:
        fmt: The chat format ``tr`` was built with (a fast tokenizer: its offsets place values).
        demo: The demonstration.
        tr: Its tokens (:func:`~srt_agent.recipe.demos.to_transcript`).

    Raises:
        ValueError: ``demo`` and ``tr`` do not match, or the tokenizer gives no offsets.
    """
    if len(demo.turns) != len(tr.turn_spans):
        raise ValueError(f"{len(demo.turns)} assistant turns but {len(tr.turn_spans)} token spans")
    backend = getattr(fmt.tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(
            f"copied values are placed by a fast tokenizer's offsets; {type(fmt.tokenizer).__name__} has none"
        )
    mask = [0] * len(tr.token_ids)
    seen = _text(demo.opening)
    for turn, (start, _) in zip(demo.turns, tr.turn_spans, strict=True):
        spans = copied_spans(turn.action, seen)
        if spans:
            enc = backend.encode(turn.action, add_special_tokens=False)
            if tuple(enc.ids) != tr.token_ids[start : start + len(enc.ids)]:
                raise ValueError("a turn's tokens differ from its text's encoding")
            for i, (a, b) in enumerate(enc.offsets):
                if any(a < e and s < b for s, e in spans):  # the token overlaps a copied value
                    mask[start + i] = 1
        seen += "\n" + turn.action + "\n" + _text(turn.observation)
    return tuple(mask)
