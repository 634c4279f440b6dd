"""What user code (an env, a tool) may raise and still fail only its own episode or call."""

from __future__ import annotations

FAULTS: tuple[type[BaseException], ...] = (Exception, SystemExit, KeyboardInterrupt)
"""Caught around env and tool code. ``SystemExit`` and ``KeyboardInterrupt`` raised by that code are
its failures, not the process's: a real Ctrl-C reaches a rollout as the cancellation of its tasks,
which is never caught."""


def describe_fault(exc: BaseException, *, first_line: bool = False) -> str:
    """``"<Type>: <message>"`` of an exception, even one whose ``__str__`` raises.

    Args:
        exc: The exception.
        first_line: Keep only the message's first line (the rest goes to the log).
    """
    try:
        text = str(exc)
    except FAULTS:
        text = "<the exception's message could not be printed>"
    if first_line:
        text = text.strip().split("\n", 1)[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
