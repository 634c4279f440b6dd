"""Fault injection: any registered env, wrapped so that one planned call misbehaves.

For checking that a rollout pipeline contains what env code can do wrong (the soak benchmark and
the reliability tests use it; so can a user's own CI). ``chaos/<Name>-v0`` wraps ``srt/<Name>-v0``
(:func:`register_chaos_envs`), or :func:`make_faulty` wraps any id; its ``fault`` option names
what goes wrong (``""``: nothing) and its ``rate`` option in which episodes (by the reset seed: a
share ``rate`` of the seeds; default all):

* env faults (:data:`ENV_FAULTS`) fail the episode, and the rollout must say why;
* process faults (:data:`PROCESS_FAULTS`) kill the process the env runs in (a segfault, an
  ``os._exit``): run them only with ``env_isolation="process"``, where they cost one episode;
* tool faults (:data:`TOOL_FAULTS`) replace every tool of the episode's env with one that
  misbehaves: the model gets an error message and the episode goes on.

A hang sleeps ``hang_s`` seconds (set it above the rollout's deadlines). Importing this module
registers the ``chaos/`` ids, so the command line reaches them as
``srt_agent.env.chaos:chaos/Calculator-v0``::

    srt-agent eval --env srt_agent.env.chaos:chaos/Calculator-v0 -o fault=reset-segfault -o rate=0.05 \
        --isolation process
"""

from __future__ import annotations

import ctypes
import os
import random
import time
from typing import Any, SupportsFloat

import gymnasium as gym

from srt_agent.chat.messages import Message
from srt_agent.env.registration import make
from srt_agent.tooling.definition import Tool
from srt_agent.tooling.toolset import ToolSet

__all__ = [
    "ENV_FAULTS",
    "PROCESS_FAULTS",
    "TOOL_FAULTS",
    "FaultyEnv",
    "make_faulty",
    "register_chaos_envs",
]

HANG_S = 1.5
"""A hang's default length."""
TOOL_TIMEOUT_S = 0.2
"""Deadline of the tools that replace an env's tools (so a tool hang is cut short)."""
HUGE_CHARS = 10_000_000
"""Characters of a huge output (a tool's or an observation's)."""

ENV_FAULTS: dict[str, str] = {
    "make-raise": "env raised RuntimeError: injected in make in make",
    "reset-raise": "env raised RuntimeError: injected in reset in reset",
    "reset-hang": "env reset did not return within",
    "reset-malformed": "reset returned observation 'not messages' (str)",
    "step-raise": "env raised RuntimeError: injected in step in step",
    "step-hang": "env step did not return within",
    "step-malformed": "step returned reward None (NoneType)",
    "step-nan": "step returned reward nan; expected a finite number",
    "step-exit": "env raised SystemExit: 3 in step",
}
"""Env faults and the words the failed episode's reason contains."""

PROCESS_FAULTS: dict[str, str] = {
    "reset-segfault": "killed by signal 11 (SIGSEGV)",
    "step-os-exit": "exit code 7",
}
"""Faults that end the env's process, and the words the failed episode's reason contains."""

TOOL_FAULTS: dict[str, str] = {
    "tool-raise": "Error (error): RuntimeError: injected in a tool",
    "tool-hang": "Error (timeout)",
    "tool-huge": "[... truncated",
    "tool-unprintable": "could not be shown as text",
}
"""Tool faults and the words a tool message of the episode contains."""

HARMLESS_FAULTS: dict[str, str] = {"step-huge": "[... truncated"}
"""Faults the rollout absorbs without failing the episode (a huge observation is cut), and the words
the episode's last env message contains."""


class Unprintable:
    """A value whose text cannot be made."""

    def __str__(self) -> str:
        raise RuntimeError("no text")

    __repr__ = __str__


def _faulty_tool(kind: str, hang_s: float) -> Any:
    def fn(**_: Any) -> Any:
        if kind == "tool-raise":
            raise RuntimeError("injected in a tool")
        if kind == "tool-hang":
            time.sleep(hang_s)
        if kind == "tool-huge":
            return "z" * HUGE_CHARS
        return Unprintable()

    return fn


class FaultyEnv(gym.Wrapper[Any, str, Any, str]):
    """An env with one planned fault (see the module docstring)."""

    def __init__(self, env: gym.Env[Any, str], fault: str, hang_s: float = HANG_S, rate: float = 1.0) -> None:
        super().__init__(env)
        self.planned, self.hang_s, self.rate = fault, hang_s, rate
        self.fault = fault

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """The wrapped env's ``reset``, or the planned fault (in a share ``rate`` of the seeds)."""
        self.fault = self.planned if faults_seed(seed, self.rate) else ""
        if self.fault == "reset-raise":
            raise RuntimeError("injected in reset")
        if self.fault == "reset-hang":
            time.sleep(self.hang_s)
        if self.fault == "reset-segfault":
            ctypes.string_at(0)  # reads address 0: SIGSEGV
        obs, info = self.env.reset(seed=seed, options=options)
        if self.fault == "reset-malformed":
            return "not messages", info
        if self.fault in TOOL_FAULTS:
            self._break_tools()
        return obs, info

    def _break_tools(self) -> None:
        inner: Any = self.env.unwrapped
        bad = [
            Tool(
                t.name,
                t.description,
                _faulty_tool(self.fault, self.hang_s),
                t.args_model,
                timeout=TOOL_TIMEOUT_S,
            )
            for t in inner.tools
        ]
        inner.tools = ToolSet(
            bad,
            max_output_chars=inner.tools.max_output_chars,
            max_calls_per_turn=inner.tools.max_calls_per_turn,
        )

    def step(self, action: str) -> tuple[tuple[Message, ...], SupportsFloat, bool, bool, dict[str, Any]]:
        """The wrapped env's ``step``, or the planned fault."""
        if self.fault == "step-raise":
            raise RuntimeError("injected in step")
        if self.fault == "step-hang":
            time.sleep(self.hang_s)
        if self.fault == "step-exit":
            raise SystemExit(3)
        if self.fault == "step-os-exit":
            os._exit(7)
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.fault == "step-malformed":
            return obs, None, terminated, truncated, info  # type: ignore[return-value]
        if self.fault == "step-nan":
            return obs, float("nan"), terminated, truncated, info
        if self.fault == "step-huge":
            obs = (*obs, Message(role="user", content="y" * HUGE_CHARS))
        return obs, reward, terminated, truncated, info


def faults_seed(seed: int | None, rate: float) -> bool:
    """Whether the episode of reset seed ``seed`` gets the fault, at ``rate`` (the same answer every run)."""
    return rate >= 1.0 or random.Random(f"chaos/{seed}").random() < rate


def make_faulty(
    base: str, fault: str = "", hang_s: float = HANG_S, rate: float = 1.0, **options: Any
) -> gym.Env[Any, str]:
    """``base`` made with ``options``, wrapped to misbehave as ``fault`` says.

    A hang lasts ``hang_s``; the fault comes in a share ``rate`` of the reset seeds (``make-raise``:
    in every episode).

    Raises:
        ValueError: ``fault`` is not a known fault, or ``rate`` is outside [0, 1].
    """
    known = {"", *ENV_FAULTS, *PROCESS_FAULTS, *TOOL_FAULTS, *HARMLESS_FAULTS}
    if fault not in known:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(sorted(known - {''}))}")
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be in [0, 1], got {rate}")
    if fault == "make-raise":
        raise RuntimeError("injected in make")
    return FaultyEnv(make(base, **options), fault, hang_s, rate)


CHAOS_BASES = ("Calculator", "GuessNumber", "Retail")
"""The built-in envs :func:`register_chaos_envs` wraps."""


def register_chaos_envs() -> list[str]:
    """Register ``chaos/<Name>-v0`` for each of :data:`CHAOS_BASES` (idempotent); returns their ids."""
    ids = []
    for name in CHAOS_BASES:
        env_id = f"chaos/{name}-v0"
        if env_id not in gym.registry:
            gym.register(
                id=env_id,
                entry_point="srt_agent.env.chaos:make_faulty",
                kwargs={"base": f"srt/{name}-v0"},
                disable_env_checker=True,
            )
        ids.append(env_id)
    return ids


register_chaos_envs()
