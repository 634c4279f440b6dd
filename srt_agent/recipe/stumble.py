"""A demonstrator that makes one mistake and recovers from it: the oracle with one call mistyped.

An oracle never errs, so a model trained only on its demonstrations has never seen a tool error
followed by a correct retry. Sampled at temperature 1 a small model writes one wrong digit of an id
sooner or later; the tool answers with an error, and the model, which has never seen an error in
its context, loses the thread for the rest of the episode. The stumbling demonstrator plays the
env's oracle, except that one of the episode's first tool calls is first sent with one argument
mistyped (a digit or a letter changed) or its JSON broken; the env answers with an error and the
next turn is the oracle's correct call. The mistaken turn is kept in the demonstration as context
with no loss (:attr:`srt_agent.recipe.demos.DemoTurn.trained` false), so a model learns the retry,
never the mistake.
"""

from __future__ import annotations

import json
import string
import zlib
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from srt_agent.chat.messages import Message
from srt_agent.env.episode_loop import Policy
from srt_agent.env.multi_turn import Observation, oracle_policy
from srt_agent.tooling.parser import CLOSE_TAG, OPEN_TAG, format_tool_call, parse_tool_calls

MISTAKE_AT_MOST = 4
"""The mistaken call is one of the episode's first this many tool calls (where a run derails)."""


class StumblingOracle:
    """The oracle of the current task, with one tool call sent mistyped first (module docstring).

    Args:
        oracle: The env's oracle for the current task; asked once per turn except on the retry.
        rng: Picks which call is mistyped and how.

    Attributes:
        mistakes: Indexes (0-based, in the episode) of the assistant turns that were mistakes.
    """

    def __init__(self, oracle: Policy, rng: np.random.Generator):
        self.oracle = oracle
        self.rng = rng
        self.mistakes: list[int] = []
        self._at = int(rng.integers(MISTAKE_AT_MOST))
        self._calls = 0
        self._turn = 0
        self._retry: str | None = None

    def act(self, history: Sequence[Message]) -> str:
        """The oracle's action, or its mistyped version at the chosen call, then the retry."""
        turn, self._turn = self._turn, self._turn + 1
        if self._retry is not None:
            # The correct call as the oracle first meant it: an oracle that keeps state must not be
            # asked twice for one step.
            action, self._retry = self._retry, None
            return action
        action = self.oracle.act(history)
        if self.mistakes or not parse_tool_calls(action).has_calls:
            return action
        self._calls += 1
        if self._calls - 1 != self._at:
            return action
        wrong = mistype_call(action, self.rng)
        if wrong is None:  # nothing to mistype in this call: try the next one
            self._at += 1
            return action
        self.mistakes.append(turn)
        self._retry = action
        return wrong


def stumbling_policy(env: gym.Env[Observation, str]) -> Policy:
    """The stumbling demonstrator of the env's current task, seeded by its task id; call after ``reset``."""
    seed = zlib.crc32(str(getattr(env.unwrapped, "task_id", "")).encode())
    return StumblingOracle(oracle_policy(env), np.random.default_rng(seed))


def mistype_call(action: str, rng: np.random.Generator) -> str | None:
    """``action`` (one or more tool calls) with one call made wrong, or ``None`` if it has no call.

    Three times in four one string argument (or one string in a list argument) gets one letter or
    digit changed, as a model's wrong sample would; otherwise the call's JSON loses one closing
    brace, as a model that stopped too early would write it.
    """
    parsed = parse_tool_calls(action)
    if not parsed.has_calls:
        return None
    call = parsed.calls[int(rng.integers(len(parsed.calls)))]
    original = format_tool_call(call.name, dict(call.arguments))
    if original not in action:
        return None
    if rng.random() < 0.75:
        arguments = _mistype_arguments(dict(call.arguments), rng)
        if arguments is not None:
            return action.replace(original, format_tool_call(call.name, arguments), 1)
    body = json.dumps({"name": call.name, "arguments": call.arguments})
    return action.replace(original, f"{OPEN_TAG}{body[:-1]}{CLOSE_TAG}", 1)


def _mistype_arguments(arguments: dict[str, Any], rng: np.random.Generator) -> dict[str, Any] | None:
    """The arguments with one character of one string changed, or ``None`` if none has letters or digits."""
    slots: list[tuple[str, int | None]] = []
    for key, value in arguments.items():
        if isinstance(value, str) and _changeable(value):
            slots.append((key, None))
        elif isinstance(value, list):
            slots += [(key, i) for i, v in enumerate(value) if isinstance(v, str) and _changeable(v)]
    if not slots:
        return None
    key, index = slots[int(rng.integers(len(slots)))]
    if index is None:
        arguments[key] = _mistype(arguments[key], rng)
    else:
        values = list(arguments[key])
        values[index] = _mistype(values[index], rng)
        arguments[key] = values
    return arguments


def _changeable(value: str) -> bool:
    return any(c.isalnum() and c.isascii() for c in value)


def _mistype(value: str, rng: np.random.Generator) -> str:
    """``value`` with one ASCII letter or digit replaced by another of its kind (digits preferred)."""
    digits = [i for i, c in enumerate(value) if c.isdigit() and c.isascii()]
    positions = digits or [i for i, c in enumerate(value) if c.isalpha() and c.isascii()]
    i = positions[int(rng.integers(len(positions)))]
    c = value[i]
    alphabet = (
        string.digits if c.isdigit() else string.ascii_lowercase if c.islower() else string.ascii_uppercase
    )
    choices = [a for a in alphabet if a != c]
    return value[:i] + choices[int(rng.integers(len(choices)))] + value[i + 1 :]
