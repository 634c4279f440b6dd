"""A fault injector for soaks: built-in envs wrapped so that one planned call misbehaves.

``soak/<Name>-v0`` wraps ``srt/<Name>-v0``; its ``fault`` option says what goes wrong in that
episode (``""``: nothing). Env faults fail the episode (the rollout must say why); tool faults
replace every tool of the episode's env with one that misbehaves (the model must get an error
message and the episode goes on). A hang sleeps ``HANG_S``, longer than the soak's deadlines, so the
call is abandoned and its thread ends by itself soon after.
"""

from __future__ import annotations

import time
from typing import Any, SupportsFloat

import gymnasium as gym

from srt_agent.chat.messages import Message
from srt_agent.env.registration import make
from srt_agent.tooling.definition import Tool
from srt_agent.tooling.toolset import ToolSet

HANG_S = 1.5
"""How long a hang lasts: over the soak's env deadline (1 s) and tool deadline, short enough to end."""
TOOL_TIMEOUT_S = 0.2

ENV_FAULTS: dict[str, str] = {
    "make-raise": "env raised RuntimeError: injected in make in make",
    "reset-raise": "env raised RuntimeError: injected in reset in reset",
    "reset-hang": "env reset did not return within",
    "reset-malformed": "reset returned observation 'not messages' (str)",
    "step-raise": "env raised RuntimeError: injected in step in step",
    "step-hang": "env step did not return within",
    "step-malformed": "step returned reward None (NoneType)",
    "step-exit": "env raised SystemExit: 3 in step",
}
"""Env faults and the words the failed episode's reason must contain."""

TOOL_FAULTS: dict[str, str] = {
    "tool-raise": "Error (error): RuntimeError: injected in a tool",
    "tool-hang": "Error (timeout)",
    "tool-huge": "[... truncated",
    "tool-unprintable": "could not be shown as text",
}
"""Tool faults and the words a tool message of the episode must contain."""


class Unprintable:
    """A value whose text cannot be made."""

    def __str__(self) -> str:
        raise RuntimeError("no text")

    __repr__ = __str__


def _faulty(kind: str, hang_s: float) -> Any:
    def fn(**_: Any) -> Any:
        if kind == "tool-raise":
            raise RuntimeError("injected in a tool")
        if kind == "tool-hang":
            time.sleep(hang_s)
        if kind == "tool-huge":
            return "z" * 10_000_000
        return Unprintable()

    return fn


class FaultyEnv(gym.Wrapper[Any, str, Any, str]):
    """A built-in env with one planned fault (see the module docstring)."""

    def __init__(self, env: gym.Env[Any, str], fault: str, hang_s: float = HANG_S) -> None:
        super().__init__(env)
        self.fault, self.hang_s = fault, hang_s

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        if self.fault == "reset-raise":
            raise RuntimeError("injected in reset")
        if self.fault == "reset-hang":
            time.sleep(self.hang_s)
        obs, info = self.env.reset(seed=seed, options=options)
        if self.fault == "reset-malformed":
            return "not messages", info
        if self.fault in TOOL_FAULTS:
            inner: Any = self.env.unwrapped
            bad = [
                Tool(
                    t.name,
                    t.description,
                    _faulty(self.fault, self.hang_s),
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
        return obs, info

    def step(self, action: str) -> tuple[tuple[Message, ...], SupportsFloat, bool, bool, dict[str, Any]]:
        if self.fault == "step-raise":
            raise RuntimeError("injected in step")
        if self.fault == "step-hang":
            time.sleep(self.hang_s)
        if self.fault == "step-exit":
            raise SystemExit(3)
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.fault == "step-malformed":
            return obs, None, terminated, truncated, info  # type: ignore[return-value]
        return obs, reward, terminated, truncated, info


def make_faulty(base: str, fault: str = "", hang_s: float = HANG_S, **options: Any) -> gym.Env[Any, str]:
    """``base`` made with ``options``, wrapped to misbehave as ``fault`` says (a hang lasts ``hang_s``)."""
    if fault == "make-raise":
        raise RuntimeError("injected in make")
    return FaultyEnv(make(base, **options), fault, hang_s)


BASES = ("Calculator", "GuessNumber", "Retail")
for _name in BASES:
    if f"soak/{_name}-v0" not in gym.registry:
        gym.register(
            id=f"soak/{_name}-v0",
            entry_point=make_faulty,  # type: ignore[arg-type]
            kwargs={"base": f"srt/{_name}-v0"},
            disable_env_checker=True,
        )
